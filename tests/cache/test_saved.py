"""A cache at rest (compact / restore) and saved to a file (save / load_cache), for every tier, on the tiny hybrid
Gemma 3: the same view bit for bit, the same greedy tokens after a resume, and a clear error for every bad file."""

import copy
import dataclasses
import json
import struct

import pytest
import safetensors.torch
import torch

from codeckv.cache import CodecCache, calibration, make_cache
from codeckv.cache.attention import use_codec_attention
from codeckv.cache.coded_layer import CodedLayer
from codeckv.cache.kv_scales import KVScales, kv_absmax, needs_scales
from codeckv.cache.layers import CodecLayer
from codeckv.cache.saved_format import MAX_FILE_BYTES, SavedCacheError, tier_from_spec, tier_spec
from codeckv.cache.saved_load import load_cache
from codeckv.codecs.quant import GroupQuant
from codeckv.custom_tier import custom_tier
from codeckv.measure.generate import next_logits
from codeckv.tiers import TIERS

CODEC_TIERS = [name for name, tier in TIERS.items() if not tier.is_native and tier.press is None]  # a pressed cache
# is refused by the format (tests/cache/test_presses.py)
PER_TENSOR = [name for name in CODEC_TIERS if TIERS[name].joint is None]
PROMPT = 45  # tokens: several archive units of every tier, a raw tail, past the sliding window (16)
SCALES = "fp8 scales"  # the key of the tiny model's KVScales among its calibrations
CASES = [(name, False) for name in CODEC_TIERS] + [(name, True) for name in PER_TENSOR]
DEFAULT_PATH = [("turbo-4", None), ("jpeg-k4", None)]  # make_cache's default: a short context's view


@pytest.fixture(scope="module")
def tiny(tiny_gemma3_builder):
    """The tiny hybrid model (routed to codec attention), its PCA calibrations, and a prompt."""
    model = tiny_gemma3_builder()
    use_codec_attention(model)
    ids = torch.randint(0, 128, (4, 64), generator=torch.Generator().manual_seed(1))
    calibrations = {t.joint: calibration.calibrate(model, ids, t.joint, "tiny") for t in TIERS.values() if t.joint}
    calibrations[SCALES] = KVScales("tiny", kv_absmax(model, ids))  # fp8-e4m3-cal's
    prompt = torch.randint(0, 128, (1, PROMPT), generator=torch.Generator().manual_seed(2))
    return model, calibrations, prompt


def _calibration(calibrations: dict, tier):
    """What `tier` takes from the tiny model: its PCA calibration, its FP8 scales, or nothing."""
    return calibrations[SCALES] if needs_scales(tier) else calibrations.get(tier.joint)


def _cache(tiny, tier, materialization_free=False, **overrides):
    model, calibrations, _ = tiny
    tier = TIERS[tier] if isinstance(tier, str) else tier
    return make_cache(model.config, tier, materialization_free, _calibration(calibrations, tier), **overrides)


@torch.inference_mode()
def _greedy(model, cache, first, steps):
    """Feed `first` (1, T), then `steps` greedy tokens: (the tokens, the logits of every step)."""
    tokens, logits, feed = [], [], first
    for _ in range(steps):
        out = next_logits(model, feed, cache)
        logits.append(out)
        tokens.append(int(out.argmax()))
        feed = torch.tensor([[tokens[-1]]])
    return tokens, logits


def _views(cache):
    return [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers if type(layer) is not CodedLayer
            and isinstance(layer, CodecLayer)]


@pytest.mark.parametrize("tier, materialization_free", CASES)
def test_compact_holds_archive_and_raw_tokens_and_restores_bit_for_bit(tiny, tier, materialization_free):
    model, _, prompt = tiny
    cache = _cache(tiny, tier, materialization_free)
    _greedy(model, cache, prompt, 3)  # a prefill, then decode steps: archived both ways
    cache.flush()  # archives, and drops what the windows passed
    before, twin = _views(cache), copy.deepcopy(cache)
    held = cache.footprint()
    cache.compact()
    rest = cache.footprint()
    assert rest.archive_bytes == held.archive_bytes and rest.tokens == held.tokens, "compaction loses nothing"
    assert rest.resident_bytes == rest.archive_bytes, "at rest a cache holds its archive and raw tokens, nothing more"
    if not materialization_free:
        assert rest.resident_bytes < held.resident_bytes, "the decoded view is gone"
        assert all(layer._view_k is None for layer in cache.layers if isinstance(layer, CodecLayer))
    seconds = cache.restore()
    assert seconds > 0 if not materialization_free else seconds == 0.0
    for (k, v), (k0, v0) in zip(_views(cache), before):
        assert torch.equal(k, k0) and torch.equal(v, v0), f"{tier}: the restored view differs from the original"
    cache.compact()  # the next update restores by itself
    got, got_logits = _greedy(model, cache, torch.tensor([[7]]), 3)
    want, want_logits = _greedy(model, twin, torch.tensor([[7]]), 3)
    assert got == want and torch.equal(torch.stack(got_logits), torch.stack(want_logits)), f"{tier}: same logits"


@pytest.mark.parametrize("tier, materialization_free", CASES + DEFAULT_PATH)
def test_resume_from_a_file_gives_the_same_greedy_tokens(tiny, tier, materialization_free, tmp_path):
    model, calibrations, prompt = tiny
    cache = _cache(tiny, tier, materialization_free)
    tokens, _ = _greedy(model, cache, prompt, 3)
    held = torch.cat([prompt[0], torch.tensor(tokens[:-1])])  # the last token is not fed yet
    size = cache.save(tmp_path / "c.kvc", held, model)
    fp = cache.footprint()
    assert size < fp.archive_bytes + fp.native_layer_bytes + 64 * 1024, "the file is the archive plus a small header"
    saved = load_cache(tmp_path / "c.kvc", model, calibration=_calibration(calibrations, TIERS[tier]))
    assert isinstance(saved.cache, CodecCache) and torch.equal(saved.token_ids[0], held)
    assert saved.cache.footprint().archive_bytes == fp.archive_bytes
    feed = torch.tensor([[tokens[-1]]])
    want, want_logits = _greedy(model, cache, feed, 5)
    got, got_logits = _greedy(model, saved.cache, feed, 5)
    assert saved.cache.attention == cache.attention, "resumed on the path the saved cache was on"
    assert got == want, f"{tier}: a resumed cache must answer as the saved one"
    torch.testing.assert_close(torch.stack(got_logits), torch.stack(want_logits), rtol=0, atol=0)


@pytest.mark.parametrize("tier", [
    custom_tier(block_size=8, k=4, bits=4, rotation=True, lloyd_max=True, keep_first=4, keep_recent=8),
    custom_tier(bits=3, value_bits=2, per_channel_keys=True, keep_recent=5),
    {"tier": "turbo-4", "keep_first": 3, "keep_recent": 11},
])
def test_custom_tiers_and_overrides_are_saved_as_data(tiny, tier, tmp_path):
    model, _, prompt = tiny
    cache = _cache(tiny, **tier) if isinstance(tier, dict) else _cache(tiny, tier)
    assert tier_from_spec(json.loads(json.dumps(tier_spec(cache.tier)))) == cache.tier
    tokens, _ = _greedy(model, cache, prompt, 3)
    cache.save(tmp_path / "c.kvc", torch.cat([prompt[0], torch.tensor(tokens[:-1])]), model)
    saved = load_cache(tmp_path / "c.kvc", model)
    assert saved.cache.tier == cache.tier
    feed = torch.tensor([[tokens[-1]]])
    assert _greedy(model, saved.cache, feed, 5)[0] == _greedy(model, cache, feed, 5)[0]


SCHEDULES = [  # the tiny model's full-attention layers are 2 and 5
    ("turbo-4", {5: "int8"}, False),
    ("turbo-3", {2: "jpeg-k8-int8"}, None),  # jpeg on its codes, turbo-3 on its codes: one mode per layer
    ("int8", {5: "pca-8x"}, None),  # a PCA layer (a decoded view) beside a layer on its codes
    ("pca-16x", {2: "pca-8x"}, False),  # two PCA tiers, each layer with its own tier's coder
]


@pytest.mark.parametrize("base, per_layer, materialization_free", SCHEDULES)
def test_a_per_layer_schedule_is_saved_and_resumes_with_the_same_tokens(tiny, base, per_layer, materialization_free,
                                                                       tmp_path):
    model, calibrations, prompt = tiny
    cache = make_cache(model.config, base, materialization_free, list(calibrations.values()), per_layer=per_layer)
    assert {index: cache.layers[index].tier.name for index in per_layer} == per_layer
    tokens, _ = _greedy(model, cache, prompt, 3)
    cache.save(tmp_path / "s.kvc", torch.cat([prompt[0], torch.tensor(tokens[:-1])]), model)
    saved = load_cache(tmp_path / "s.kvc", model, calibration=list(calibrations.values()))
    assert saved.cache.tier == cache.tier and saved.header["tier"]["per_layer"][0][0] == next(iter(per_layer))
    assert [type(a) for a in saved.cache.layers] == [type(b) for b in cache.layers], "each layer in its own mode"
    assert saved.cache.footprint().archive_bytes == cache.footprint().archive_bytes
    feed = torch.tensor([[tokens[-1]]])
    want, want_logits = _greedy(model, cache, feed, 4)
    got, got_logits = _greedy(model, saved.cache, feed, 4)
    assert got == want, f"{cache.tier.name}: a resumed schedule must answer as the saved one"
    torch.testing.assert_close(torch.stack(got_logits), torch.stack(want_logits), rtol=0, atol=0)


def test_a_native_full_attention_layer_is_saved_with_its_tokens(tiny, tmp_path):
    """A schedule's (or a tier's boundary) native full-attention layer goes in the file as "native.keys / values"."""
    model, _, prompt = tiny
    cache = make_cache(model.config, "native", False, per_layer={5: "int8"})
    _greedy(model, cache, prompt, 1)
    cache.save(tmp_path / "n.kvc", prompt, model)
    saved = load_cache(tmp_path / "n.kvc", model)
    assert [c["kind"] for c in saved.header["layers"]] == ["sliding"] * 2 + ["native"] + ["sliding"] * 2 + ["codec"]
    assert torch.equal(saved.cache.layers[2].keys, cache.layers[2].keys)
    assert torch.equal(saved.cache.layers[2].values, cache.layers[2].values)


@pytest.fixture
def saved_file(tiny, tmp_path):
    """A turbo-4 cache file of the tiny model (and its tensors and header, to forge bad files from)."""
    model, _, prompt = tiny
    cache = _cache(tiny, "turbo-4")
    _greedy(model, cache, prompt, 1)
    path = tmp_path / "good.kvc"
    cache.save(path, prompt, model, extra={"note": "test"})
    tensors = safetensors.torch.load_file(str(path))
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(json.loads(f.read(length))["__metadata__"]["codeckv"])
    return path, tensors, header


def _forge(tmp_path, tensors, header, name="bad.kvc"):
    path = tmp_path / name
    metadata = {"codeckv": header if isinstance(header, str) else json.dumps(header)}
    safetensors.torch.save_file(tensors, str(path), metadata=metadata)
    return path


def test_a_good_file_loads_with_its_extra(tiny, saved_file):
    path, _, header = saved_file
    saved = load_cache(path, tiny[0])
    assert saved.header["extra"] == {"note": "test"} and saved.header["tokens"] == PROMPT
    assert header["format"] == "codeckv-cache" and header["version"] == 3


def _refused(path, model, match, **kwargs):
    with pytest.raises(SavedCacheError, match=match):
        load_cache(path, model, **kwargs)


def test_truncated_and_oversized_files_are_refused(tiny, saved_file, tmp_path):
    path, _, _ = saved_file
    data = path.read_bytes()
    for cut in (4, 200, len(data) - 1):
        (tmp_path / "cut.kvc").write_bytes(data[:cut])
        _refused(tmp_path / "cut.kvc", tiny[0], "truncated")
    (tmp_path / "more.kvc").write_bytes(data + b"\0")
    _refused(tmp_path / "more.kvc", tiny[0], "extra bytes")
    _refused(path, tiny[0], f"{len(data):,} bytes, more than the 1,000 allowed", max_bytes=1000)
    assert MAX_FILE_BYTES >= 256 << 20, "the default cap admits a long lossless cache"
    (tmp_path / "junk.kvc").write_bytes(b"\x10" + b"\0" * 7 + b"not json at all!")
    _refused(tmp_path / "junk.kvc", tiny[0], "not a codeckv-cache file")


def test_corrupted_headers_and_tensors_are_refused(tiny, saved_file, tmp_path):
    path, tensors, header = saved_file
    model = tiny[0]
    _refused(_forge(tmp_path, tensors, "{not json"), model, "not a codeckv-cache file")
    _refused(_forge(tmp_path, tensors, {**header, "version": 4}), model, r"version 4.*allowed: 1, 2, 3")
    _refused(_forge(tmp_path, tensors, {**header, "format": "other"}), model, "not a codeckv-cache file")
    bad_tier = {**header, "tier": {**header["tier"], "key": {"codec": "os.system"}}}
    _refused(_forge(tmp_path, tensors, bad_tier), model, "allowed: Cast, DCT")
    bad_bits = {**header, "tier": {**header["tier"], "key": {**header["tier"]["key"], "bits": 5}}}
    _refused(_forge(tmp_path, tensors, bad_bits), model, "cannot be rebuilt")
    missing = {k: v for k, v in tensors.items() if k != "codec.tail_keys"}
    _refused(_forge(tmp_path, missing, header), model, r"missing \['codec.tail_keys'\]")
    reshaped = {**tensors, "codec.tail_keys": tensors["codec.tail_keys"][..., :32].contiguous()}
    _refused(_forge(tmp_path, reshaped, header), model, "tensor 'codec.tail_keys' is")
    retyped = {**tensors, "codec.sink_keys": tensors["codec.sink_keys"].half()}
    _refused(_forge(tmp_path, retyped, header), model, "torch.float16")
    counts = {**header, "layers": [{**layer, "archived_upto": 3} if layer["kind"] == "codec" else layer
                                   for layer in header["layers"]]}
    _refused(_forge(tmp_path, tensors, counts), model, "counts")
    _refused(_forge(tmp_path, tensors, {**header, "batch": 10**9}), model, "token ids are not the 1000000000 x 45")
    huge = {**tensors, "token_ids": torch.zeros(1, 300, dtype=torch.int32)}
    _refused(_forge(tmp_path, huge, {**header, "tokens": 300}), model, "more than this model's context of 256")
    flipped = {**tensors, "codec.keys.codes": tensors["codec.keys.codes"] ^ 1}
    _refused(_forge(tmp_path, flipped, header), model, "checksum")


def test_hostile_headers_are_refused(tiny, saved_file, tmp_path):
    """A raw window past any context (the Advanced knob's bound is 2**20), application data changed after saving (the
    checksum covers the header), and a version-2 file carrying application data (its checksum left it out)."""
    _, tensors, header = saved_file
    model = tiny[0]
    huge = {**header, "tier": {**header["tier"], "keep_recent": 10**9}}
    _refused(_forge(tmp_path, tensors, huge), model, r"keep_recent=1000000000 must be an integer in 0\.\.1048576")
    changed = {**header, "extra": {"note": "changed"}}
    _refused(_forge(tmp_path, tensors, changed), model, "header or tensors do not match")
    _refused(_forge(tmp_path, tensors, {**header, "version": 2}), model, "version 2, whose checksum leaves out")


def test_a_file_for_another_model_or_calibration_is_refused(tiny, saved_file, tmp_path):
    from transformers import Gemma3ForCausalLM

    path, _, _ = saved_file
    model, calibrations, prompt = tiny
    config = copy.deepcopy(model.config)
    config.num_key_value_heads = 2
    other = Gemma3ForCausalLM(config).eval()
    _refused(path, other, "another shape")
    cache = _cache(tiny, "turbo-4")
    _greedy(model, cache, prompt, 1)
    try:
        model.config.name_or_path = "tiny/a"
        cache.save(tmp_path / "named.kvc", prompt, model)
        model.config.name_or_path = "tiny/b"
        _refused(tmp_path / "named.kvc", model, "saved from tiny/a, not tiny/b")
    finally:
        model.config.name_or_path = ""
    cache = _cache(tiny, "pca-8x")
    _greedy(model, cache, prompt, 1)
    cache.save(tmp_path / "pca.kvc", prompt, model)
    ids = torch.randint(0, 128, (4, 64), generator=torch.Generator().manual_seed(9))
    recalibrated = calibration.calibrate(model, ids, TIERS["pca-8x"].joint, "tiny")
    _refused(tmp_path / "pca.kvc", model, "calibrated differently", calibration=recalibrated)
    _refused(tmp_path / "pca.kvc", model, "materialization_free", materialization_free=True,
             calibration=calibrations[TIERS["pca-8x"].joint])


def test_save_refuses_what_it_cannot_write_back(tiny, tmp_path):
    model, _, prompt = tiny
    cache = _cache(tiny, "turbo-4")
    _greedy(model, cache, prompt, 1)
    with pytest.raises(SavedCacheError, match="holds 45 tokens but 44"):
        cache.save(tmp_path / "c.kvc", prompt[:, :-1], model)
    with pytest.raises(SavedCacheError, match="token_ids must be"):
        cache.save(tmp_path / "c.kvc", torch.zeros(0, dtype=torch.long), model)
    assert not (tmp_path / "c.kvc").exists(), "a refused save writes nothing"


class _OwnQuant(GroupQuant):
    """A codec defined outside codeckv.codecs: the format cannot rebuild it from data."""


def test_a_tier_with_a_foreign_codec_is_refused():
    tier = dataclasses.replace(TIERS["int8"], key=_OwnQuant(bits=8, group=32))
    with pytest.raises(SavedCacheError, match="cannot be saved"):
        tier_spec(tier)
