"""CodecCache as a transformers Cache: raw until N, exactness of png, beams, crop, causal safety, hybrid layers,
footprint, conversion of a native cache (from_cache) and batched archiving across layers."""

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from codeckv.cache import CodecCache, footprint, held_bytes, make_cache
from codeckv.cache.coded_layer import CodedLayer
from codeckv.cache.flush import flush_layers
from codeckv.cache.kv_scales import needs_scales
from codeckv.cache.layers import CodecLayer
from codeckv.cache.schedule import schedule
from codeckv.tiers import TIERS

PROMPT = "The history of the printing press begins in"
# Tiers whose codecs code keys and values on their own; the PCA tiers need a calibrated model (tests/cache/test_pca.py),
# calibrated FP8 scales theirs (tests/cache/test_kv_scales.py); presses are tests/cache/test_presses.py's.
PER_TENSOR_TIERS = [name for name, t in TIERS.items() if not t.is_native and t.joint is None
                    and not needs_scales(t) and t.press is None]


@pytest.fixture(scope="module")
def prompt_ids(loaded):
    return loaded.tokenizer(PROMPT, return_tensors="pt").input_ids


def _greedy(model, ids, cache, n, **kwargs):
    out = model.generate(ids, cache=cache, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kwargs)
    return out[:, ids.shape[1] :]


# The N of every per-tensor preset on fp32 states (codeckv/cache/layers.py, "Raw until N"): on its codes, its first
# unit; reading a decoded view (a view layer, or a codes layer whose decode steps would read a short context's
# view), the end of a short context (SHORT_VIEW_TOKENS, 40 in the test); png never: its archive is as large as
# the raw tokens it codes.
SHORT = 40
OWN_N = {"png": (None, None), "int8": (32, SHORT), "jpeg-k8-int8": (32, SHORT), "rotated-4": (32, SHORT),
         "turbo-4": (32, SHORT), "turbo-3": (32, SHORT), "turbo-k4v2": (32, SHORT)}


@pytest.mark.parametrize("mode", ["codes", "short view", "view"])
@pytest.mark.parametrize("tier", PER_TENSOR_TIERS)
def test_a_layer_holds_what_native_holds_until_its_own_n_then_archives(tier, mode, monkeypatch):
    for module in ("layers", "coded_layer"):
        monkeypatch.setattr(f"codeckv.cache.{module}.SHORT_VIEW_TOKENS", SHORT)
    monkeypatch.setattr("codeckv.cache.coded_layer.attention_compiled", lambda *_: False)  # a short view's case
    on_codes, view = OWN_N.get(tier, (8, SHORT))
    want = on_codes if mode == "codes" else view
    layer = (CodecLayer(TIERS[tier], raw_until=None) if mode == "view"
             else CodedLayer(TIERS[tier], short_view=mode == "short view", raw_until=None))
    native = DynamicLayer()
    torch.manual_seed(0)
    archived_at = None
    for x in [torch.randn(1, 3, 5, 64)] + [torch.randn(1, 3, 1, 64) for _ in range(45)]:  # a prefill, decode steps
        before = layer.length
        layer.update(x, -x)
        native.update(x, -x)
        if layer.holds_raw:
            keys, values = layer.raw() if isinstance(layer, CodedLayer) else (layer.keys, layer.values)
            assert torch.equal(keys, native.keys) and torch.equal(values, native.values), f"{tier}: token for token"
            assert layer.held_bytes() == native.keys.nbytes + native.values.nbytes, f"{tier}: native's bytes"
        elif archived_at is None:
            archived_at = before  # the update that archived saw this many tokens
    assert layer.raw_until == want, f"{tier} ({mode}) says raw until {layer.raw_until}"
    assert archived_at == want, f"{tier} ({mode}): archived at {archived_at} tokens, not at its N"
    if want is not None and mode == "codes":
        assert layer.held_bytes() < native.keys.nbytes + native.values.nbytes, "on the codes the archive pays off"
    if mode == "short view":
        assert not layer.on_view, "beyond a short context a codes layer reads its codes, no view"


def test_a_cache_says_raw_until_n_per_layer_and_archives_from_the_start_when_asked(tiny_gemma3):
    from codeckv.cache.attention import use_codec_attention

    use_codec_attention(tiny_gemma3)  # its CodedLayers attend on the codes
    config = tiny_gemma3.config
    own = make_cache(config, "turbo-4", True, per_layer={5: "jpeg-k4"}, raw_until=None)
    asked = make_cache(config, "turbo-4", False, per_layer={5: "jpeg-k4"}, raw_until=0)
    ids = torch.randint(0, 128, (1, 20), generator=torch.Generator().manual_seed(5))
    native = DynamicCache(config=config)
    with torch.inference_mode():
        for cache in (own, asked, native):
            tiny_gemma3(ids, cache=cache)
            tiny_gemma3(ids[:, :1], cache=cache)  # the next update archives what became archivable
    assert own.raw_until == {0: 32, 1: 32, 2: 32, 3: 32, 4: 32, 5: 8}, "the sliding layers' too"
    assert asked.raw_until == dict.fromkeys(range(6), 0)
    assert own.layers[2].holds_raw and not own.layers[5].holds_raw, "turbo-4 holds 21 tokens raw, jpeg archived 16"
    assert asked.layers[2].holds_raw and not asked.layers[5].holds_raw, "20 tokens: no complete turbo-4 unit yet"
    layers = [2, 5]
    assert [own.layers[i].keys.shape for i in layers] == [native.layers[i].keys.shape for i in layers]
    assert held_bytes(own) < held_bytes(native), "each layer holds no more than native's; int8's archive less"
    with pytest.raises(ValueError, match="allowed: a fresh or reset cache"):
        own.set_raw_until(0)


def test_png_generates_exactly_the_native_tokens(loaded, prompt_ids):
    native = _greedy(loaded.model, prompt_ids, DynamicCache(config=loaded.model.config), 64)
    codec = CodecCache.from_config(loaded.model.config, "png", raw_until=0)
    got = _greedy(loaded.model, prompt_ids, codec, 64)
    assert torch.equal(native, got), "png is lossless: its greedy tokens must equal the native cache's"
    assert codec.layers[0].archive_k.tokens > 0, "blocks must really have been archived"


def test_png_beam_search_matches_native(loaded, prompt_ids):
    native = _greedy(loaded.model, prompt_ids, DynamicCache(config=loaded.model.config), 20, num_beams=3)
    got = _greedy(loaded.model, prompt_ids, CodecCache.from_config(loaded.model.config, "png", raw_until=0), 20,
                  num_beams=3)
    assert torch.equal(native, got)


@pytest.mark.parametrize("remove", [1, 5, 8, 13])
def test_crop_then_continue_equals_a_fresh_run(loaded, remove):
    ids = loaded.tokenizer(PROMPT + " the fifteenth century, when Johannes", return_tensors="pt").input_ids
    model = loaded.model
    cache = CodecCache.from_config(model.config, "png", raw_until=0)
    with torch.inference_mode():
        model(ids, cache=cache)
        cache.crop(-remove)
        assert cache.get_seq_length() == ids.shape[1] - remove
        cropped_logits = model(ids[:, -remove:], cache=cache).logits
        fresh_logits = model(ids, cache=CodecCache.from_config(model.config, "png", raw_until=0)).logits[:, -remove:]
    torch.testing.assert_close(cropped_logits, fresh_logits, rtol=1e-4, atol=1e-4, msg="crop then continue")


@pytest.mark.parametrize("tier", ["jpeg-k2-int8", "turbo-4", "png"])
def test_archived_bytes_never_change_when_later_tokens_change(tier):
    """Causal safety: the archive of the first blocks is bitwise independent of anything appended later."""
    torch.manual_seed(0)
    layer = CodecLayer(TIERS[tier], raw_until=0)
    first = torch.randn(1, 2, 32, 64)
    layer.update(first, first.clone())
    layer.update(torch.randn(1, 2, 1, 64), torch.randn(1, 2, 1, 64))  # flushes the first 32 tokens
    before = {k: v.clone() for k, v in layer.archive_k.encoded().data.items()}
    archived = layer.archive_k.tokens
    for _ in range(40):  # more than one archive unit (32 tokens for per-channel keys)
        noise = 1e3 * torch.randn(1, 2, 1, 64)
        layer.update(noise, noise)
    after = layer.archive_k.encoded().data
    for name, tensor in before.items():
        assert torch.equal(after[name][:, :, : tensor.shape[2]], tensor), f"{tier}: archived '{name}' changed"
    assert layer.archive_k.tokens > archived


def test_decode_step_writes_in_place_without_reallocating():
    layer = CodecLayer(TIERS["jpeg-k8-int8"], raw_until=0)
    layer.update(torch.randn(1, 2, 40, 64), torch.randn(1, 2, 40, 64))
    layer.update(torch.randn(1, 2, 1, 64), torch.randn(1, 2, 1, 64))  # archives; the view grows a quarter: 50
    pointer = layer._view_k.data_ptr()
    for _ in range(9):
        keys, _ = layer.update(torch.randn(1, 2, 1, 64), torch.randn(1, 2, 1, 64))
    assert layer._view_k.data_ptr() == pointer, "a decode step must not reallocate the view"
    assert keys.shape[2] == layer._view_k.shape[2] == 50 and keys.data_ptr() == pointer


def test_keep_first_and_keep_recent_stay_exact():
    tier = TIERS["jpeg-k2"]
    layer = CodecLayer(tier.__class__(**{**tier.__dict__, "keep_first": 4, "keep_recent": 16}), raw_until=0)
    x = torch.randn(1, 1, 100, 64)
    layer.update(x, x)
    keys, _ = layer.update(torch.zeros(1, 1, 1, 64), torch.zeros(1, 1, 1, 64))
    assert torch.equal(keys[:, :, :4], x[:, :, :4]), "sink tokens are kept at full precision"
    assert torch.equal(keys[:, :, 84:100], x[:, :, 84:100]), "the recent window is kept at full precision"
    assert not torch.equal(keys[:, :, 4:84], x[:, :, 4:84]), "the middle is archived lossily"
    assert layer.archived_upto == 4 + 80


def test_footprint_png_equals_native_bytes_and_is_honest(loaded, prompt_ids):
    native_cache = DynamicCache(config=loaded.model.config)
    codec = CodecCache.from_config(loaded.model.config, "png", raw_until=0)
    with torch.inference_mode():
        loaded.model(prompt_ids, cache=native_cache)
        loaded.model(prompt_ids, cache=codec)
    native, fp = footprint(native_cache), codec.footprint()
    assert fp.archive_bytes == native.archive_bytes, "png stores exactly the native cache's bytes"
    assert fp.bf16_bytes == native.bf16_bytes == 2 * 30 * 3 * prompt_ids.shape[1] * 64 * 2
    assert fp.resident_bytes >= fp.archive_bytes
    assert len(fp.layers) == 30 and fp.native_layer_bytes == 0


def test_lossy_tier_footprint_ratio(loaded):
    codec = CodecCache.from_config(loaded.model.config, "turbo-4", raw_until=0)
    ids = torch.randint(100, 5000, (1, 256))
    with torch.inference_mode():
        loaded.model(ids, cache=codec)
    fp = codec.footprint()
    assert fp.ratio <= 0.32, f"turbo-4 archive is {fp.ratio:.3f} of bf16"


def test_hybrid_gemma3_codes_every_attention_layer_its_windows_too(tiny_gemma3):
    model, config = tiny_gemma3, tiny_gemma3.config
    cache = CodecCache.from_config(config, "png", raw_until=0)
    assert all(isinstance(layer, CodecLayer) for layer in cache.layers)
    assert [layer.window for layer in cache.layers] == [16, 16, None, 16, 16, None]
    ids = torch.randint(0, 128, (1, 40))
    native = _greedy(model, ids, DynamicCache(config=config), 24)
    assert torch.equal(_greedy(model, ids, cache, 24), native), "png on a hybrid model is exact, its windows too"
    fp = cache.footprint()
    assert fp.native_layer_bytes == 0 and fp.archive_bytes > 0
    assert all(layer.held < 16 + layer.unit for layer in cache.layers if layer.window), "a window drops what it passed"
    left = CodecCache.from_config(config, schedule("jpeg-k8-int8", {0: "native"}), raw_until=0)
    assert type(left.layers[0]).__name__ == "DynamicSlidingWindowLayer", "native on a window keeps transformers'"


def test_native_tier_builds_plain_dynamic_layers(loaded):
    cache = CodecCache.from_config(loaded.model.config, "native")
    assert not any(isinstance(layer, CodecLayer) for layer in cache.layers)


def test_reset_empties_the_cache_for_reuse(loaded, prompt_ids):
    cache = CodecCache.from_config(loaded.model.config, "png")
    first = _greedy(loaded.model, prompt_ids, cache, 12)
    cache.reset()
    assert cache.get_seq_length() == 0 and cache.footprint().archive_bytes == 0
    assert torch.equal(_greedy(loaded.model, prompt_ids, cache, 12), first), "a reset cache behaves like a new one"


def test_archiving_goes_through_the_kernel_ops(monkeypatch):
    """A CodecLayer encodes and decodes through kernels.encode / kernels.decode (Triton on CUDA, the codec on CPU)."""
    import codeckv.cache.flush as flush

    calls = []
    encode, decode = flush.encode, flush.decode
    monkeypatch.setattr(flush, "encode", lambda x, codec: calls.append("encode") or encode(x, codec))
    monkeypatch.setattr(flush, "decode", lambda enc, codec: calls.append("decode") or decode(enc, codec))
    layer = CodecLayer(TIERS["turbo-4"], raw_until=0)
    layer.update(torch.randn(1, 2, 40, 64), torch.randn(1, 2, 40, 64))
    layer.flush()
    assert calls == ["encode", "decode", "encode", "decode"] and layer.archive_k.tokens == 32


def _held(layer) -> dict[str, torch.Tensor]:
    """Everything a codec layer holds: its archives' stored tensors, and its decoded view or raw sinks / tail."""
    held = {}
    for side, archive in (("k", layer.archive_k), ("v", layer.archive_v)):
        if archive.tokens:
            held.update({f"{side}.{name}": t for name, t in archive.encoded().data.items()})
    if isinstance(layer, CodedLayer):
        for name in ("_sinks", "_tail"):
            pair = getattr(layer, name)
            if pair is not None:
                held[name + ".k"], held[name + ".v"] = pair
    else:
        held["view.k"], held["view.v"] = layer.keys, layer.values
    return held


@pytest.fixture(scope="module")
def converted_prompt(loaded):
    """130 corpus tokens and the native DynamicCache after their prefill (from_cache leaves it unchanged)."""
    from codeckv.corpus import corpus_windows

    ids = corpus_windows(loaded.tokenizer, 1, 130)
    native = DynamicCache(config=loaded.model.config)
    with torch.inference_mode():
        loaded.model(ids, cache=native)
    return ids, native


@pytest.mark.parametrize("windows", [{}, {"keep_first": 4, "keep_recent": 20}], ids=["plain", "sinks+window"])
@pytest.mark.parametrize("materialization_free", [False, True], ids=["view", "materialization-free"])
@pytest.mark.parametrize("tier", PER_TENSOR_TIERS)
def test_from_cache_equals_prefill_through_the_codec_cache(loaded, converted_prompt, tier, materialization_free,
                                                           windows):
    ids, native = converted_prompt
    config = loaded.model.config
    through = make_cache(config, tier, materialization_free=materialization_free, raw_until=0, **windows)
    with torch.inference_mode():
        loaded.model(ids, cache=through)
    through.flush()
    converted = CodecCache.from_cache(native, tier, materialization_free=materialization_free, raw_until=0, **windows)
    assert converted.get_seq_length() == through.get_seq_length() == ids.shape[1]
    first = next(i for i, layer in enumerate(through.layers) if isinstance(layer, CodecLayer))  # vLLM's: layer 2
    assert converted.layers[first].archive_k.tokens == through.layers[first].archive_k.tokens > 0
    for index, (want, got) in enumerate(zip(through.layers, converted.layers)):
        if not isinstance(want, CodecLayer):  # a boundary layer the tier leaves native: the same raw tokens
            assert type(got) is type(want) and torch.equal(got.keys, want.keys), f"{tier} layer {index}: native"
            continue
        want_held, got_held = _held(want), _held(got)
        assert got_held.keys() == want_held.keys(), f"layer {index}: holds {sorted(got_held)}"
        for name, tensor in want_held.items():
            assert torch.equal(got_held[name], tensor), f"{tier} layer {index}: '{name}' differs"
    assert converted.footprint().archive_bytes == through.footprint().archive_bytes


def test_from_cache_copies_sliding_layers_and_rejects_native(tiny_gemma3):
    model, config = tiny_gemma3, tiny_gemma3.config
    native = DynamicCache(config=config)
    with torch.inference_mode():
        model(torch.randint(0, 128, (1, 40)), cache=native)
    converted = CodecCache.from_cache(native, schedule("jpeg-k8-int8", {4: "native"}))
    assert [i for i, layer in enumerate(converted.layers) if isinstance(layer, CodecLayer)] == [0, 1, 2, 3, 5]
    for i in (0, 1, 3):  # sliding layers hold the window's 15 tokens, from position 25: what native holds
        assert converted.layers[i].first == 25 and converted.layers[i].held == 15
        assert converted.layers[i].get_mask_sizes(1) == native.layers[i].get_mask_sizes(1)
    assert converted.layers[4] is not native.layers[4], "a layer left native is copied: the native cache stays usable"
    assert torch.equal(converted.layers[4].keys, native.layers[4].keys)
    with pytest.raises(ValueError, match="native"):
        CodecCache.from_cache(native, "native")


@pytest.mark.parametrize("tier", PER_TENSOR_TIERS)
def test_batched_flush_stores_what_each_layer_stores_alone(tier):
    """flush_layers encodes several layers' tokens at once: the same bytes and views as one flush per layer."""
    torch.manual_seed(1)
    states = [(torch.randn(1, 2, 70, 64), torch.randn(1, 2, 70, 64)) for _ in range(3)]
    alone, batched = ([CodecLayer(TIERS[tier], raw_until=0) for _ in states] for _ in range(2))
    for (k, v), a, b in zip(states, alone, batched):
        a.update(k, v)
        a.flush()
        b.update(k, v)
    flush_layers(batched)
    for a, b in zip(alone, batched):
        assert _held(a).keys() == _held(b).keys()
        assert all(torch.equal(t, _held(b)[name]) for name, t in _held(a).items()), f"{tier}: batched flush differs"


def test_a_long_span_is_archived_in_runs_with_the_same_bytes(monkeypatch):
    """flush_layers cuts a span larger than its batch size into runs of whole units: the same archive and view."""
    import codeckv.cache.flush as flush

    torch.manual_seed(2)
    k, v = torch.randn(1, 2, 200, 64), torch.randn(1, 2, 200, 64)
    whole, runs = CodecLayer(TIERS["turbo-4"], raw_until=0), CodecLayer(TIERS["turbo-4"], raw_until=0)
    whole.update(k, v)
    whole.flush()
    monkeypatch.setitem(flush.BATCH_BYTES, "cpu", 1)  # one archive unit per encode call
    runs.update(k, v)
    runs.flush()
    assert runs.archive_k.tokens == whole.archive_k.tokens == 192
    assert all(torch.equal(t, _held(runs)[name]) for name, t in _held(whole).items())


def _generate_logprobs(loaded, texts: list[str], tier: str, materialization_free: bool, tell_padding: bool):
    """Greedy 10 tokens for a left-padded batch of texts: (batch, steps, vocab) log-probs."""
    tokenizer = loaded.tokenizer
    tokenizer.padding_side = "left"
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    mask = batch.attention_mask if tell_padding else None
    cache = make_cache(loaded.model.config, tier, materialization_free, attention_mask=mask, raw_until=0)
    out = loaded.model.generate(
        **batch, cache=cache, max_new_tokens=10, do_sample=False, output_logits=True,
        return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id,
    )
    return torch.stack(out.logits, dim=1).log_softmax(-1)


@pytest.mark.parametrize("tier, materialization_free", [("turbo-k4v2", False), ("jpeg-k8-int8", True)])
def test_a_left_padded_row_is_coded_like_its_text_alone(loaded, tier, materialization_free):
    """With the batch's attention mask, pad tokens stay raw sinks and the padded row's sinks stay raw too."""
    from codeckv.corpus import corpus_text
    from codeckv.measure.lockstep import kl_divergence

    ids = loaded.tokenizer(corpus_text()[:4000], return_tensors="pt").input_ids[0]
    long_text, short_text = loaded.tokenizer.decode(ids[:120]), loaded.tokenizer.decode(ids[7:60])
    alone = _generate_logprobs(loaded, [short_text], tier, materialization_free, True)[0]
    padded = _generate_logprobs(loaded, [long_text, short_text], tier, materialization_free, True)[1]
    assert float(kl_divergence(alone, padded).mean()) < 1e-3
    if not materialization_free:  # without the mask the pads share key scales with real tokens, sinks get coded
        unaware = _generate_logprobs(loaded, [long_text, short_text], tier, materialization_free, False)[1]
        assert float(kl_divergence(alone, unaware).mean()) > 1e-3
