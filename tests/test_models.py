"""The embedded model loads offline, answers, is converted once, and bad names fail clearly."""

import pytest
from transformers import DynamicCache

from codeckv.generate import chat_input_ids, greedy_stream, stop_token_ids
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
