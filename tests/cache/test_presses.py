"""A press in a cache: after each prefill chunk's attention the layer keeps the press's tokens and frees the others;
the positions of the next tokens and the masks stay those of every token seen."""

import pytest
import torch

from codeckv.cache import CodecCache, held_bytes, make_cache
from codeckv.cache.attention import use_codec_attention
from codeckv.cache.saved_format import SavedCacheError
from codeckv.measure.families import tiny_model
from codeckv.presses import Budget, SnapKVPress, StreamingLLMPress, TOVAPress
from codeckv.tiers import TIERS, Tier, compose, get_tier


def _greedy(model, ids, cache, n=12):
    out = model.generate(ids, cache=cache, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[:, ids.shape[1] :]


@pytest.fixture(scope="module")
def prompt(loaded):
    from codeckv.corpus import corpus_text

    return loaded.tokenizer(corpus_text()[:4000], return_tensors="pt").input_ids[:, :600]


@pytest.mark.parametrize("materialization_free", [False, None], ids=["view", "codes"])
def test_a_press_that_keeps_everything_changes_nothing(loaded, prompt, materialization_free):
    keeps_all = [Tier("snapkv-0", "", press=SnapKVPress(0.0)),
                 compose(Tier("snapkv-0", "", press=SnapKVPress(0.0)), TIERS["png"])]
    with torch.inference_mode():
        native = _greedy(loaded.model, prompt, make_cache(loaded, "native"))
        for tier in keeps_all:
            assert torch.equal(_greedy(loaded.model, prompt, make_cache(loaded, tier, materialization_free)), native)


@pytest.mark.parametrize("name", ["streamingllm-50", "snapkv-75", "knorm-50", "tova-75", "expected-50"])
def test_a_press_frees_what_it_evicts_and_keeps_the_positions(loaded, prompt, name):
    tier = get_tier(name)
    with torch.inference_mode():
        native, pressed = make_cache(loaded, "native"), make_cache(loaded, tier)
        for cache in (native, pressed):
            loaded.model(prompt, cache=cache)
    kept = pressed.layers[0].held
    assert kept == int(600 * (1 - tier.press.ratio)) and pressed.get_seq_length() == 600
    positions = kept * 3 * 8 * 30  # each kept token's position, per KV head and layer (int64)
    assert held_bytes(pressed) == held_bytes(native) * kept // 600 + positions, "the evicted are gone"
    fp = pressed.footprint()
    assert fp.bf16_bytes == native.layers[0].keys.numel() * 2 * 2 * 30, "bf16 of every token seen: native's"
    assert fp.layers[0].evicted_tokens == 600 - kept
    with torch.inference_mode():
        token = prompt[:, -1:]
        for _ in range(4):  # decode steps at positions 600..603: the press leaves them alone
            token = loaded.model(token, cache=pressed).logits[:, -1:].argmax(-1)
    assert pressed.get_seq_length() == 604 and pressed.layers[0].held == kept + 4
    positions = pressed.layers[0].positions()  # (1, H, held): the kept prompt positions, then 600..603
    assert positions.shape == (1, 3, kept + 4) and positions[0, :, -4:].tolist() == [[600, 601, 602, 603]] * 3
    assert bool((positions[..., 1:] > positions[..., :-1]).all()) and int(positions.max()) == 603


def test_streamingllm_equals_native_attention_masked_to_the_tokens_it_keeps():
    """One KV head and full attention only: the press's cache decodes like a native cache whose mask hides exactly the
    evicted middle, at the same positions."""
    model = tiny_model("llama")
    model.config.num_key_value_heads = 1
    model = tiny_model_with(model.config)
    use_codec_attention(model)
    ids = torch.randint(3, 160, (1, 40), generator=torch.Generator().manual_seed(0))
    pressed = make_cache(model.config, Tier("streaming", "", press=StreamingLLMPress(0.5, sinks=4)))
    native = make_cache(model.config, "native")
    visible = torch.ones(1, 40 + 6, dtype=torch.long)
    visible[0, 4:24] = 0  # kept: 4 sinks and the newest 16 of the prompt's 40
    with torch.inference_mode():
        model(ids, cache=pressed)
        model(ids, cache=native)
        token = ids[:, -1:]
        for step in range(6):
            position = torch.tensor([[40 + step]])
            want = model(token, cache=native, attention_mask=visible[:, : 41 + step], position_ids=position).logits
            got = model(token, cache=pressed, position_ids=position).logits
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f"step {step}")
            token = want[:, -1:].argmax(-1)


def tiny_model_with(config):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def test_each_prefill_chunk_is_pressed_as_it_arrives_and_cannot_be_saved(loaded, prompt, tmp_path):
    cache = make_cache(loaded, "snapkv-50+turbo-4", press_mode="chunked")
    with torch.inference_mode():
        loaded.model(prompt[:, :400], cache=cache)
        loaded.model(prompt[:, 400:], cache=cache)
    assert cache.get_seq_length() == 600 and cache.layers[5].evicted == 200 + 100
    assert cache.footprint().ratio < 0.2, "half the tokens, each at turbo-4's bytes"
    with pytest.raises(SavedCacheError, match="its press evicted 300 tokens, which this format cannot save"):
        cache.save(tmp_path / "pressed.kvc", prompt, loaded)
    assert not (tmp_path / "pressed.kvc").exists()


def test_a_press_is_refused_where_it_cannot_score(tiny_gemma3, loaded):
    with pytest.raises(ValueError, match="evicts tokens after each prefill chunk's attention"):
        make_cache(tiny_gemma3.config, "snapkv-50")  # not routed through codeckv's attention
    with pytest.raises(ValueError, match="a PCA tier removes RoPE at each token's position"):
        Tier("bad", "", joint=TIERS["pca-8x"].joint, press=SnapKVPress(0.5))
    with pytest.raises(ValueError, match="is not a per-tensor codec tier"):
        get_tier("snapkv-50+pca-8x")
    with pytest.raises(ValueError, match="is not a per-tensor codec tier on every layer"):
        get_tier("snapkv-50+vllm-tq-k8v4")  # its boundary layers would stay native, unpressed
    with pytest.raises(ValueError, match="is not a press tier"):
        get_tier("turbo-4+int8")
    assert isinstance(make_cache(loaded, "tova-50"), CodecCache) and not TIERS["tova-50"].is_native


def test_a_budget_holds_each_layer_at_its_size_through_prefill_and_decoding(loaded, prompt):
    tier = get_tier("tova-budget256")
    cache, native = make_cache(loaded, tier), make_cache(loaded, "native")
    with torch.inference_mode():
        logits = loaded.model(prompt, cache=cache).logits
        loaded.model(prompt, cache=native)
        assert {layer.held for layer in cache.layers} == {256}, "the prefill pressed back to the budget at once"
        sizes = []
        for _ in range(40):
            token = logits[:, -1:].argmax(-1)
            logits = loaded.model(token, cache=cache).logits
            loaded.model(token, cache=native)
            sizes.append(cache.layers[7].held)
    assert max(sizes) == 256 + tier.press.interval - 1 and sizes.count(256) == 2, "pressed at steps 16 and 32"
    assert cache.get_seq_length() == native.get_seq_length() == 640, "positions count every token seen"
    layer = cache.layers[7]
    assert layer.positions()[0, 0, -1].item() == 639, "TOVA keeps the newest token"
    queries = layer._queries.numel() * layer._queries.element_size()
    assert queries == 9 * 64 * 4, "TOVA's budget keeps one query (9 heads of 64 fp32 values) to score with"
    per_token = native.layers[7].keys[0, :, 0].numel() * 4 * 2  # K and V, fp32
    assert layer.held_bytes() == layer.held * per_token + layer.held * 3 * 8 + queries, "tokens, positions, query"


def test_streamingllm_under_a_budget_keeps_the_sinks_and_the_newest(loaded, prompt):
    cache = make_cache(loaded, "streamingllm-budget256")
    with torch.inference_mode():
        loaded.model(prompt, cache=cache)
    assert cache.layers[0].positions()[0, 0].tolist() == [0, 1, 2, 3, *range(600 - 252, 600)]
    assert cache.layers[0]._queries is None, "it reads no query, so it keeps none"


def test_a_budget_stays_with_a_press_alone():
    with pytest.raises(ValueError, match="not a press tier that evicts at prefill"):
        get_tier("tova-budget256+turbo-4")
    with pytest.raises(ValueError, match="a token budget evicts tokens the layer already holds"):
        Tier("bad", "", key=TIERS["int8"].key, value=TIERS["int8"].value, press=Budget(press=TOVAPress()))
    with pytest.raises(ValueError, match="must be a press that scores tokens"):
        Budget(press=Budget(press=TOVAPress()))
    with pytest.raises(ValueError, match=r"tokens=1 must be a whole number in 2\.\."):
        Budget(press=TOVAPress(), tokens=1)
