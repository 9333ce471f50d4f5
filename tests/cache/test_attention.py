"""Materialization-free attention (cache/attention.py): same tokens as the materialized cache, resident ~ archive."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from codeckv.cache import CODES, SHORT_VIEW, CodecCache, held_bytes, make_cache
from codeckv.cache.attention import use_codec_attention
from codeckv.cache.coded_layer import SHORT_VIEW_TOKENS, TAG, CodedLayer
from codeckv.cache.kernel_ops import attention_compiled
from codeckv.cache.kv_scales import needs_scales
from codeckv.cache.layers import CodecLayer
from codeckv.tiers import TIERS
from kernels.codes_cpu import codes_status

RESIDENT_SLACK = 0.05  # resident bytes may exceed the archive by at most 5% (at 4k tokens)


@pytest.fixture(scope="module")
def long_prompt(loaded):
    """About 270 tokens of the embedded corpus: the archive holds dozens of blocks."""
    from pydoc_data.topics import topics

    return loaded.tokenizer(topics[sorted(topics)[3]][:1500], return_tensors="pt").input_ids


@pytest.fixture
def codec_attention_model(loaded):
    """The session model, routed through codec attention as load_model leaves it (restored if a test changes it)."""
    use_codec_attention(loaded.model)
    yield loaded.model
    use_codec_attention(loaded.model)


def _greedy(model, ids, cache, n):
    out = model.generate(ids, cache=cache, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[:, ids.shape[1] :]


# Two attention paths on the same stored tokens agree up to float rounding, which 30 layers and 16 tokens amplify:
# at most 0.019 in the embedded model's logits, over six emulated CPUs (scripts/float_noise.py, "paths";
# assets/float-noise.csv). A test of two paths compares their predictions of the same tokens within 5x that, and
# their top-1 wherever it leads by more than twice the tolerance: greedy tokens alone could flip at a near-tie.
PATH_LOGITS_ATOL = 0.1


def _predictions(model, ids, cache, continuation):
    """Logits (n, vocab) of every position of `continuation` (n,), fed after the prompt `ids` (1, T)."""
    with torch.inference_mode():
        first = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1:]
        rest = [model(input_ids=token.view(1, 1), cache=cache).logits[0, -1:] for token in continuation[:-1]]
    return torch.cat([first, *rest]).float()


def _assert_same_predictions(want, got, atol=PATH_LOGITS_ATOL, label=""):
    """Logits within atol everywhere, and the same top-1 wherever want's leads by more than 2 atol."""
    assert (want - got).abs().max() <= atol, f"{label}: logits differ by {(want - got).abs().max():.3g} > {atol}"
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * atol
    assert clear.sum() >= want.shape[0] // 2, f"{label}: too few clear positions to compare top-1"
    assert torch.equal(want.argmax(-1)[clear], got.argmax(-1)[clear]), f"{label}: top-1 differs at a clear position"


@pytest.mark.parametrize("tier", ["png", "jpeg-k8-int8"])
def test_attention_on_the_codes_predicts_what_the_materialized_cache_does(loaded, long_prompt, codec_attention_model,
                                                                        tier):
    config = loaded.model.config
    tokens = _greedy(loaded.model, long_prompt, CodecCache.from_config(config, tier, raw_until=0), 16)[0]
    materialized = _predictions(loaded.model, long_prompt, CodecCache.from_config(config, tier, raw_until=0), tokens)
    cache = make_cache(config, tier, materialization_free=True, raw_until=0)
    _assert_same_predictions(materialized, _predictions(codec_attention_model, long_prompt, cache, tokens), label=tier)
    assert all(isinstance(layer, CodedLayer) for layer in cache.layers)
    assert cache.layers[0].archive_k.tokens > 200, "the archive must really be read"


def test_the_default_path_holds_a_short_context_raw_or_when_asked_decodes_it_on_a_view_like_the_codes(
    loaded, long_prompt, codec_attention_model
):
    """A DCT tier on the CPU would decode a short context on a view (no compiled kernel reads its codes): raw until
    the tier's own N (raw_until=None, the Chat's) holds it raw instead, predicting and holding what native does; the
    default, raw_until=0, archives and decodes on that view, with the predictions of the codes."""
    config = loaded.model.config
    tokens = _greedy(codec_attention_model, long_prompt, make_cache(config, "jpeg-k8-int8", True), 16)[0]
    raw, native = make_cache(config, "jpeg-k8-int8", raw_until=None), DynamicCache(config=config)
    got = _predictions(codec_attention_model, long_prompt, raw, tokens)
    assert torch.equal(got, _predictions(codec_attention_model, long_prompt, native, tokens)), "raw: native's"
    assert held_bytes(raw) == held_bytes(native) and set(raw.raw_until.values()) == {SHORT_VIEW_TOKENS}
    codes = make_cache(config, "jpeg-k8-int8", materialization_free=True)
    default = make_cache(config, "jpeg-k8-int8", raw_until=0)
    want = _predictions(codec_attention_model, long_prompt, codes, tokens)
    _assert_same_predictions(want, _predictions(codec_attention_model, long_prompt, default, tokens), label="default")
    assert set(default.attention.values()) == {SHORT_VIEW} and set(codes.attention.values()) == {CODES}, \
        "the cache reports which path each layer ran on"
    view_bytes = sum(layer._view_k.nbytes + layer._view_v.nbytes for layer in default.layers)
    assert held_bytes(default) == held_bytes(codes) + view_bytes, "held counts the view"
    default.compact()
    codes.compact()
    assert set(default.attention.values()) == {CODES} and held_bytes(default) == held_bytes(codes), "at rest: no view"


@pytest.mark.parametrize("tier, compiled", [("jpeg-k8-int8", False), ("turbo-4", False), ("int8", False),
                                            ("turbo-4", True)])
def test_short_view_attends_like_the_codes_and_goes_past_its_length(tier, compiled, monkeypatch):
    """Without the compiled kernel (or for tiers it does not read) a short context's decode steps read a view;
    where it reads both sides' codes, the codes are read at every length and no view is ever built."""
    monkeypatch.setattr("codeckv.cache.coded_layer.SHORT_VIEW_TOKENS", 100)
    if not compiled:
        monkeypatch.setattr("codeckv.cache.coded_layer.attention_compiled", lambda *_: False)
    elif not attention_compiled(TIERS[tier].key, TIERS[tier].value, 64):
        pytest.skip(f"the compiled CPU kernel is not built here ({codes_status()})")
    torch.manual_seed(0)
    config = dataclasses.replace(TIERS[tier], keep_first=3, keep_recent=5)
    short, coded = CodedLayer(config, short_view=True, raw_until=0), CodedLayer(config, raw_until=0)
    x, y = torch.randn(1, 3, 70, 64), torch.randn(1, 3, 70, 64)
    assert hasattr(short.update(x, y)[0], TAG) and not short.on_view, "a prefill chunk never builds the view"
    coded.update(x, y)
    for step in range(40):
        k, v = torch.randn(1, 3, 1, 64), torch.randn(1, 3, 1, 64)
        keys, values = short.update(k, v)
        coded.update(k, v)
        query = torch.randn(1, 9, 1, 64)
        want = short.length <= 100 and not compiled
        assert short.on_view == want, f"step {step}: the view lives up to SHORT_VIEW_TOKENS, never where compiled"
        if short.on_view:
            got = F.scaled_dot_product_attention(query, keys, values, enable_gqa=True)
            torch.testing.assert_close(got, coded.attend(query, None, None), atol=1e-5, rtol=1e-5, msg=f"step {step}")
            assert short.held_bytes() == coded.held_bytes() + short._view_k.nbytes + short._view_v.nbytes
        else:
            assert hasattr(keys, TAG) and short.held_bytes() == coded.held_bytes(), "past it: the codes alone"
    assert short.archive_k.tokens == coded.archive_k.tokens > 64


def test_native_cache_under_codec_attention_is_plain_sdpa(loaded, codec_attention_model):
    ids = loaded.tokenizer("The history of the printing press begins in", return_tensors="pt").input_ids
    native = _greedy(loaded.model, ids, DynamicCache(config=loaded.model.config), 8)
    loaded.model.set_attn_implementation("sdpa")
    assert torch.equal(native, _greedy(loaded.model, ids, DynamicCache(config=loaded.model.config), 8))


@pytest.mark.parametrize("tier", ["png", "jpeg-k2-int8", "turbo-4"])
def test_layer_attends_like_the_materialized_layer_through_crop_and_beams(tier):
    torch.manual_seed(0)
    config = dataclasses.replace(TIERS[tier], keep_first=3, keep_recent=5)
    materialized, coded = CodecLayer(config, raw_until=0), CodedLayer(config, raw_until=0)
    x, y = torch.randn(2, 2, 70, 64), torch.randn(2, 2, 70, 64)
    materialized.update(x, y)
    coded.update(x, y)
    for step in range(12):
        k, v = torch.randn(2, 2, 1, 64), torch.randn(2, 2, 1, 64)
        keys, values = materialized.update(k, v)
        coded.update(k, v)
        query = torch.randn(2, 6, 1, 64)
        want = F.scaled_dot_product_attention(query, keys, values, enable_gqa=True)
        torch.testing.assert_close(coded.attend(query, None, None), want, atol=1e-5, rtol=1e-5, msg=f"step {step}")
        if step == 4:
            materialized.crop(-13)
            coded.crop(-13)
        if step == 8:
            beams = torch.tensor([1, 1])
            materialized.batch_select_indices(beams)
            coded.batch_select_indices(beams)
    assert coded.get_seq_length() == materialized.get_seq_length()
    assert coded.footprint(0).archive_bytes == materialized.footprint(0).archive_bytes


@pytest.mark.parametrize("tier", ["png", "jpeg-k8-int8", "turbo-4"])
def test_resident_bytes_stay_within_five_percent_of_the_archive_at_4k(tier):
    torch.manual_seed(0)
    layer = CodedLayer(TIERS[tier], raw_until=0)
    layer.update(torch.randn(1, 3, 4096, 64), torch.randn(1, 3, 4096, 64))  # a 4k prefill (smollm2 geometry)
    for _ in range(40):  # then decode steps, archiving block after block
        layer.update(torch.randn(1, 3, 1, 64), torch.randn(1, 3, 1, 64))
    fp = layer.footprint(0)
    assert fp.resident_bytes <= (1 + RESIDENT_SLACK) * fp.archive_bytes, (
        f"{tier}: resident {fp.resident_bytes} > archive {fp.archive_bytes} + {RESIDENT_SLACK:.0%}"
    )


def test_hybrid_gemma3_sliding_layers_are_coded_on_their_codes_too(tiny_gemma3):
    """The sliding-window layers (window 16, dropping what it passes) attend on their codes like the full-attention
    ones. The tiny model's paths differ by at most 3e-6 in logits on six emulated CPUs (scripts/float_noise.py's
    environments, measured with this test's prompt): compared within 1e-4."""
    model, config = tiny_gemma3, tiny_gemma3.config
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(5))
    tokens = _greedy(model, ids, CodecCache.from_config(config, "jpeg-k8-int8", raw_until=0), 24)[0]
    materialized = _predictions(model, ids, CodecCache.from_config(config, "jpeg-k8-int8", raw_until=0), tokens)
    use_codec_attention(model)
    cache = make_cache(config, "jpeg-k8-int8", materialization_free=True, raw_until=0)
    _assert_same_predictions(materialized, _predictions(model, ids, cache, tokens), atol=1e-4, label="gemma3")
    assert all(isinstance(layer, CodedLayer) for layer in cache.layers)
    assert [layer.window for layer in cache.layers] == [16, 16, None, 16, 16, None]
    assert [layer.held for layer in cache.layers] == [15, 15, 63, 15, 15, 63]  # a window: what transformers holds


def test_asking_for_the_codes_of_a_model_not_routed_says_what_to_do(tiny_gemma3):
    """A model built by transformers attends through SDPA: make_cache refuses the codes (once a meta-device error in
    the forward) and the default keeps a decoded view."""
    with pytest.raises(ValueError, match=r"materialization_free=True: .*use_codec_attention\(model\)"):
        make_cache(tiny_gemma3.config, "turbo-4", materialization_free=True)
    assert set(make_cache(tiny_gemma3.config, "turbo-4").attention.values()) == {"view"}


def test_footprint_after_an_inference_mode_forward():
    """A forward under inference_mode, then footprint() outside it: the flush must not fail."""
    layer = CodedLayer(TIERS["jpeg-k8-int8"])
    with torch.inference_mode():
        layer.update(torch.randn(1, 3, 40, 64), torch.randn(1, 3, 40, 64))
    fp = layer.footprint(0)
    assert layer.archive_k.tokens == 32 and fp.archive_bytes > 0, "one 32-token unit archived, 8 tokens raw"


@pytest.mark.parametrize("materialization_free", [False, True], ids=["view", "materialization-free"])
def test_a_bf16_model_runs_every_tier(tiny_gemma3, materialization_free):
    """On CUDA the model is bf16 (codeckv.models): nothing in the caches or the kernels' torch paths assumes fp32."""
    model, config = tiny_gemma3.to(torch.bfloat16), tiny_gemma3.config
    use_codec_attention(model)
    ids = torch.randint(0, 128, (1, 70), generator=torch.Generator().manual_seed(0))
    native = _greedy(model, ids, DynamicCache(config=config), 12)
    for name, tier in TIERS.items():
        if tier.is_native or tier.joint is not None or needs_scales(tier):  # calibrated per model: test_pca.py,
            continue  # test_kv_scales.py
        cache = make_cache(config, name, materialization_free=materialization_free, raw_until=0)
        tokens = _greedy(model, ids, cache, 12)
        fp = cache.footprint()
        assert tokens.shape == native.shape and fp.archive_bytes > 0 and cache.layers[2].keys.dtype == torch.bfloat16
        if name == "png":  # lossless in bf16 too: the native cache's bytes (and, through the view, its tokens;
            full = [f for f in fp.layers if f.kind == "codec"]  # attention on the codes accumulates in fp32)
            assert sum(f.archive_bytes for f in full) == sum(f.bf16_bytes for f in full)
            assert materialization_free or torch.equal(tokens, native)
