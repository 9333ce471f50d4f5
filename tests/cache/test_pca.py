"""The PCA tiers: RoPE removal, the ANS coder, the transform's inverse, PCALayer bytes, calibration on disk,
generation through model.generate on the hybrid tiny Gemma 3 and on the embedded model, and clear errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import DynamicCache

import codeckv.cache.calibration as calibration
import codeckv.cache.flush as flush
import codeckv.codecs.ans_vectorized as ans_vectorized
from codeckv.cache import CodecCache, make_cache
from codeckv.cache.pca_layer import PCALayer, tokens_before_coder
from codeckv.codecs.ans import LENGTH_BYTES, EntropyTable
from codeckv.codecs.ans_vectorized import DECODE_VECTORIZED, ENCODE_VECTORIZED
from codeckv.codecs.pca import JointPCA
from codeckv.codecs.rate import HEADER_BYTES, LADDER, SKIP
from codeckv.codecs.rope import Rope
from codeckv.tiers import TIERS, Tier

PCA_TIERS = [name for name, tier in TIERS.items() if tier.joint is not None]
SMALL = JointPCA(bits_per_element=1.0, calibration_windows=2, calibration_length=64)  # a fast calibration


@pytest.fixture(scope="module")
def tiny_model(tiny_gemma3_builder):
    """A random-weight hybrid Gemma 3 (conftest's, built once for this module) and its pca-8x calibration."""
    model = tiny_gemma3_builder()
    ids = torch.randint(0, 128, (4, 64), generator=torch.Generator().manual_seed(1))
    return model, calibration.calibrate(model, ids, TIERS["pca-8x"].joint, "tiny-gemma3")


def _greedy(model, ids, cache, n):
    out = model.generate(ids, cache=cache, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[:, ids.shape[1] :]


@pytest.mark.parametrize("theta, start", [(10000.0, 0), (1e6, 123), (100000.0, 4095)])
def test_rope_remove_inverts_apply(theta, start):
    rope = Rope.default(64, theta)
    x = torch.randn(2, 3, 17, 64)
    torch.testing.assert_close(rope.remove(rope.apply(x, start), start), x, rtol=1e-5, atol=1e-5,
                               msg="remove(apply(x)) must give x back")


def test_rope_matches_transformers_llama():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, rope_theta=100000.0)
    k = torch.randn(1, 1, 9, 64)
    cos, sin = LlamaRotaryEmbedding(config)(k, torch.arange(5, 14)[None])
    _, want = apply_rotary_pos_emb(k, k, cos, sin)
    torch.testing.assert_close(Rope.from_config(config).apply(k, 5), want, rtol=1e-5, atol=1e-5)


def test_ans_round_trip_is_exact_with_escapes():
    g = torch.Generator().manual_seed(0)
    scale = torch.linspace(4, 0.05, 40)
    table = EntropyTable.fit((torch.randn(5000, 40, generator=g) * scale).round().int())
    codes = (torch.randn(24, 40, generator=g) * scale).round().int()
    codes[3, 0], codes[7, 5] = 1000, -700  # outside every table: escaped
    stream = table.encode(codes)
    assert torch.equal(table.decode(stream, 24), codes)
    assert len(stream) * 8 <= float(table.bits(codes).sum()) + 64, "ANS must be within a few bytes of the ideal size"


def test_encode_many_writes_the_bytes_constriction_writes_for_each_chunk():
    """The coder the cache runs (compiled where built, else numpy's): byte for byte encode() of each chunk
    (escapes, mixed lengths, rows of any support); decode_many reads them back like decode."""
    g = torch.Generator().manual_seed(2)
    scale = torch.cat([torch.linspace(30, 0.05, 39), torch.tensor([300.0])])  # column 39: its table saturates
    table = EntropyTable.fit((torch.randn(5000, 40, generator=g) * scale).round().int())
    chunks = list((torch.randn(DECODE_VECTORIZED, 8, 40, generator=g) * scale * 1.5).round().int())
    chunks[1][0, 0], chunks[1][5, 3], chunks[4][7, 39] = 32767, -32768, 4000  # escapes, two in one chunk
    chunks += [chunks[2][:7]] + [c[:3] for c in chunks[:ENCODE_VECTORIZED]]  # fewer rows: constriction; numpy
    streams = table.encode_many(chunks)
    assert streams == [table.encode(c) for c in chunks]
    assert all(torch.equal(table.decode(s, c.shape[0]), c) for s, c in zip(streams, chunks))
    decoded = table.decode_many(streams, [c.shape[0] for c in chunks])  # numpy for the 8-row chunks
    assert all(torch.equal(d, c) for d, c in zip(decoded, chunks)), "decode_many must give every chunk's codes"


@pytest.mark.parametrize("batch_symbols", [ans_vectorized.ENCODE_BATCH_SYMBOLS, 3000])  # one pass; many small ones
def test_encode_tables_writes_each_tables_bytes(monkeypatch, batch_symbols):
    """The numpy coder (the path without a C compiler): several tables (different widths, classes and shifts) coded
    side by side, streams of different lengths ending together: chunk for chunk what constriction writes."""
    monkeypatch.setattr(ans_vectorized, "ENCODE_BATCH_SYMBOLS", batch_symbols)
    g = torch.Generator().manual_seed(3)
    jobs = []
    for width, count, rows in ((40, 30, 8), (23, 25, 8), (57, 12, 5)):
        scale = torch.linspace(6, 0.05, width)
        fitted = EntropyTable.fit((torch.randn(4000, width, generator=g) * scale).round().int())
        table = EntropyTable(fitted.probs, fitted.offset, fitted.classes.clamp(1, width - 2))  # shifts -1..1 valid
        chunks = list((torch.randn(count, rows, width, generator=g) * scale * 1.3).round().int())
        chunks[0][1, 2], chunks[-1][0, width - 1] = 900, -2000  # escapes
        chunks.append(chunks[1][:3])  # another row count of the same table
        shifts = [i % 3 - 1 for i in range(len(chunks))]
        jobs.append((table, chunks, shifts))
    got = ans_vectorized.encode_tables_numpy(jobs)
    assert got == [[table.encode(c, shift) for c, shift in zip(chunks, shifts)] for table, chunks, shifts in jobs]
    assert all(torch.equal(table.decode(stream, c.shape[0], shift), c) for (table, chunks, shifts), streams in
               zip(jobs, got) for c, stream, shift in zip(chunks, streams, shifts))


@pytest.mark.parametrize("bits", [1.0, 4.0, 8.0])
def test_layer_coder_error_falls_with_bits_and_is_small_at_high_bits(tiny_model, bits):
    model, _ = tiny_model
    ids = torch.randint(0, 128, (4, 64), generator=torch.Generator().manual_seed(1))
    coder = calibration.calibrate(model, ids, JointPCA(bits), "tiny").coders[2]
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(ids[:1], cache=cache)
    k, v = cache.layers[2].keys, cache.layers[2].values  # (1, 1, 64, 64) post-RoPE, as the cache sees them
    k_hat, v_hat = coder.decode(coder.encode(k, v, 0, 8, coder.budget(bits, 1)), 0, 8, 1, k.dtype)
    error = float(torch.cat([k_hat - k, v_hat - v]).norm() / torch.cat([k, v]).norm())
    bound = {1.0: 0.6, 4.0: 0.1, 8.0: 0.01}[bits]
    assert error <= bound, f"{bits} bits/element: relative error {error:.4f} > {bound}"


def test_pca_layer_holds_exactly_the_bytes_it_counts(tiny_model):
    _, calib = tiny_model
    layer = PCALayer(TIERS["pca-8x"], calib.coders[2])
    k, v = torch.randn(1, 1, 45, 64), torch.randn(1, 1, 45, 64)
    keys, values = layer.update(k, v)
    layer.flush()
    fp = layer.footprint(2)
    assert fp.archived_tokens == 40 and len(layer.chunks) == 5 and fp.tail_tokens == 5
    stored = sum(len(c.stream) + LENGTH_BYTES + HEADER_BYTES + (sum(e.nbytes for e in c.sink) if c.sink else 0)
                 for c in layer.chunks)
    assert fp.code_bytes == stored and fp.archive_bytes == stored + 5 * 2 * 64 * 4
    assert layer.chunks[0].sink is not None and layer.chunks[1].sink is None, "position 0 is coded apart"
    k_hat, v_hat = layer.coder.decode(layer.chunks, 0, 8, 1, k.dtype)
    assert torch.equal(layer.keys[:, :, :40], k_hat) and torch.equal(layer.values[:, :, :40], v_hat), \
        "the view holds what the stored streams decode to"
    assert torch.equal(layer.keys[:, :, 40:], k[:, :, 40:]), "the incomplete chunk stays raw"


def test_a_layer_left_without_its_coder_holds_raw_then_codes_as_one_built_with_it(tiny_model):
    """A Deferred calibration (the Chat's while it is computed): no coder is asked for below tokens_before_coder;
    at the first archive the layer finds it and stores, and views, what a layer built with it does."""
    _, calib = tiny_model
    tier, asked = TIERS["pca-8x"], []
    later = PCALayer(tier, None, raw_until=None, later=lambda: asked.append(1) or (calib.coders[2], 1.0))
    built = PCALayer(tier, calib.coders[2], 1.0, raw_until=None)
    n = tokens_before_coder(tier)
    k, v = torch.randn(1, 1, n + 9, 64), torch.randn(1, 1, n + 9, 64)
    for layer in (later, built):
        layer.update(k[:, :, :n], v[:, :, :n])
    assert asked == [] and later.raw_until == built.raw_until == n and not later.chunks, "raw: no coder needed"
    for layer in (later, built):
        layer.update(k[:, :, n:], v[:, :, n:])
    assert asked == [1] and later.chunks and [c.stream for c in later.chunks] == [c.stream for c in built.chunks]
    assert torch.equal(later.keys, built.keys) and torch.equal(later.values, built.values)


def test_a_layer_whose_share_found_later_makes_no_smaller_archive_stays_raw(tiny_model):
    _, calib = tiny_model
    layer = PCALayer(TIERS["pca-8x"], None, raw_until=None, later=lambda: (calib.coders[2], 64.0))  # 128 bits
    n = tokens_before_coder(layer.tier)
    for lo, hi in ((0, n), (n, n + 9)):
        layer.update(torch.randn(1, 1, hi - lo, 64), torch.randn(1, 1, hi - lo, 64))
    assert layer.share == 64.0 and layer.raw_until is None and not layer.chunks and layer.length == n + 9


@pytest.mark.parametrize("batch", [1, 2])
def test_a_long_flush_stores_the_bytes_of_chunk_by_chunk_coding_and_views_what_they_decode_to(tiny_model, batch):
    """A prompt's many chunks are coded together (ans.encode_many) and the view is computed from the codes:
    the same streams as coding each chunk alone, and the view bit for bit what those streams decode to."""
    _, calib = tiny_model
    layer = PCALayer(TIERS["pca-8x"], calib.coders[2])
    g = torch.Generator().manual_seed(3)
    tokens = 8 * (ENCODE_VECTORIZED + 2)
    k, v = torch.randn(batch, 1, tokens + 3, 64, generator=g), torch.randn(batch, 1, tokens + 3, 64, generator=g)
    layer.update(k, v)
    layer.flush()
    assert len(layer.chunks) == tokens // 8
    coder = layer.coder
    y = coder.project(k[:, :, :tokens], v[:, :, :tokens], 0)  # (B, tokens, r)
    alone = []
    for chunk, i in zip(layer.chunks, range(0, tokens, 8)):
        codes = coder.quantize(y[:, max(i, 1) : i + 8], coder.steps[chunk.rung])  # position 0: a sink
        alone.append(b"" if chunk.rung == SKIP else coder.table.encode(codes.reshape(-1, coder.kept),
                                                                       LADDER[chunk.rung]))
    assert [c.stream for c in layer.chunks] == alone
    k_hat, v_hat = layer.coder.decode(layer.chunks, 0, 8, batch, k.dtype)
    assert torch.equal(layer.keys[:, :, :tokens], k_hat) and torch.equal(layer.values[:, :, :tokens], v_hat)


def test_archived_chunks_never_change_and_crop_drops_whole_chunks(tiny_model):
    _, calib = tiny_model
    layer = PCALayer(TIERS["pca-16x"], calib.coders[5])
    layer.update(torch.randn(1, 1, 32, 64), torch.randn(1, 1, 32, 64))
    layer.update(torch.randn(1, 1, 1, 64), torch.randn(1, 1, 1, 64))
    before = [c.stream for c in layer.chunks]
    for _ in range(20):
        layer.update(1e3 * torch.randn(1, 1, 1, 64), 1e3 * torch.randn(1, 1, 1, 64))
    assert [c.stream for c in layer.chunks[: len(before)]] == before
    layer.crop(-20)
    assert layer.get_seq_length() == 33 and len(layer.chunks) == 4


@pytest.mark.parametrize("tier", PCA_TIERS)
def test_pca_tiers_generate_on_the_hybrid_model(tiny_model, tier):
    model, calib = tiny_model
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(2))
    cache = make_cache(model.config, tier, calibration=calib)
    tokens = _greedy(model, ids, cache, 16)
    assert tokens.shape == (1, 16)
    assert [i for i, layer in enumerate(cache.layers) if isinstance(layer, PCALayer)] == [2, 5], \
        "only full-attention layers are coded; sliding layers stay native"
    fp = cache.footprint()
    assert 0 < fp.archive_bytes < fp.bf16_bytes


def test_from_cache_equals_prefill_through_the_pca_cache(tiny_model):
    model, calib = tiny_model
    ids = torch.randint(0, 128, (1, 50), generator=torch.Generator().manual_seed(3))
    native, through = DynamicCache(config=model.config), make_cache(model.config, "pca-8x", calibration=calib)
    with torch.inference_mode():
        model(ids, cache=native)
        model(ids, cache=through)
    through.flush()
    converted = CodecCache.from_cache(native, "pca-8x", calibration=calib)
    for index in (2, 5):
        want, got = through.layers[index], converted.layers[index]
        assert [c.stream for c in got.chunks] == [c.stream for c in want.chunks] and got.chunks
        assert torch.equal(got.keys, want.keys) and torch.equal(got.values, want.values)


@pytest.mark.parametrize("batch_symbols", [flush.PCA_BATCH_SYMBOLS, 1])  # every layer in one pass; one per pass
def test_flushing_the_cache_archives_each_layer_as_its_own_flush(tiny_model, monkeypatch, batch_symbols):
    """CodecCache.flush codes its PCA layers' streams together (flush_layers, ans.encode_tables): each layer
    stores the chunks, and views the tokens, that flushing it alone gives."""
    monkeypatch.setattr(flush, "PCA_BATCH_SYMBOLS", batch_symbols)
    model, calib = tiny_model
    ids = torch.randint(0, 128, (1, 8 * ENCODE_VECTORIZED + 5), generator=torch.Generator().manual_seed(4))
    together, alone = (make_cache(model.config, "pca-8x", calibration=calib) for _ in range(2))
    with torch.inference_mode():
        model(ids, cache=together)
        model(ids, cache=alone)
    together.flush()
    pca_layers = [i for i, layer in enumerate(alone.layers) if isinstance(layer, PCALayer)]
    for index in pca_layers:
        alone.layers[index].flush()
    assert len(pca_layers) > 1
    for index in pca_layers:
        want, got = alone.layers[index], together.layers[index]
        assert [(c.stream, c.rung) for c in got.chunks] == [(c.stream, c.rung) for c in want.chunks]
        assert len(got.chunks) == ENCODE_VECTORIZED
        assert torch.equal(got.keys, want.keys) and torch.equal(got.values, want.values)


def test_pca_tiers_raise_clear_errors(tiny_model):
    model, calib = tiny_model
    with pytest.raises(ValueError, match="needs the model's calibration"):
        make_cache(model.config, "pca-8x")
    with pytest.raises(ValueError, match="materialization_free=True"):
        make_cache(model.config, "pca-8x", materialization_free=True, calibration=calib)
    other = dataclasses.replace(calib, coders={2: calib.coders[2]})
    with pytest.raises(ValueError, match=r"no coder for full-attention layers \[5\]"):
        make_cache(model.config, "pca-8x", calibration=other)
    with pytest.raises(ValueError, match="joint coder codes keys and values itself"):
        Tier("bad", "both", key=TIERS["int8"].key, joint=SMALL)
    with pytest.raises(ValueError, match="bits_per_element"):
        JointPCA(bits_per_element=0)
    cache = make_cache(model.config, "pca-8x", calibration=calib)
    with torch.inference_mode():
        model(torch.randint(0, 128, (1, 20)), cache=cache)
    with pytest.raises(ValueError, match="beam search"):
        cache.reorder_cache(torch.tensor([0]))


def test_calibration_is_computed_once_then_read_from_disk(loaded, tmp_path, monkeypatch):
    """The embedded model: a miss (computed and saved), then a hit from disk without recomputing; compute=False.
    The miss comes from make_cache inside torch.inference_mode(): calibration still gets its autograd."""
    monkeypatch.setenv("CODECKV_CACHE", str(tmp_path))
    monkeypatch.setattr(calibration, "_LOADED", {})
    tier = Tier("pca-small", "a fast calibration", joint=SMALL)
    with pytest.raises(ValueError, match="none is saved"):
        calibration.calibration_for(loaded, tier, compute=False)
    computed = []
    real = calibration.fit_basis
    monkeypatch.setattr(calibration, "fit_basis", lambda *args: computed.append(1) or real(*args))
    with torch.inference_mode():
        make_cache(loaded, tier)  # no saved calibration: computed here
    first = calibration.calibration_for(loaded, tier)
    assert computed == [1] and calibration.calibration_path("smollm2-135m", SMALL).exists()
    assert not first.coders[0].enc.is_inference(), "a shared calibration holds normal tensors, usable with autograd"
    monkeypatch.setattr(calibration, "_LOADED", {})  # a new process: only the files remain
    monkeypatch.setattr(calibration, "_BASES", {})
    second = calibration.calibration_for(loaded, tier)
    assert computed == [1], "the second call must load the saved calibration, not compute it"
    assert second.step == first.step and sorted(second.coders) == list(range(30))
    torch.testing.assert_close(second.coders[7].enc, first.coders[7].enc)
    ids = loaded.tokenizer("The history of the printing press begins in", return_tensors="pt").input_ids
    cache = make_cache(loaded, tier)  # a LoadedModel: the calibration comes by itself
    tokens = _greedy(loaded.model, ids, cache, 12)
    assert tokens.shape == (1, 12) and cache.footprint().archive_bytes > 0


def test_calibrate_inside_inference_mode_equals_calibrate_outside(tiny_model):
    """calibrate needs autograd: inside torch.inference_mode(), on ids made there, it runs outside that mode."""
    model, _ = tiny_model
    ids = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(4))
    outside = calibration.calibrate(model, ids, SMALL, "tiny")
    with torch.inference_mode():
        inside = calibration.calibrate(model, ids.clone(), SMALL, "tiny")
    assert inside.step == outside.step and not inside.coders[2].enc.is_inference()
    torch.testing.assert_close(inside.coders[5].enc, outside.coders[5].enc)


def test_inspect_reconstructs_through_the_pca_layer_and_draws_the_channel_spectrum(tiny_model):
    from codeckv.figures.plots import channel_spectrum_figure
    from codeckv.measure.inspection import KVCapture, inspect_capture

    model, calib = tiny_model
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(torch.randint(0, 128, (1, 48), generator=torch.Generator().manual_seed(4)), cache=cache)
    kinds = ["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2 + ["full_attention"]
    capture = KVCapture([0] * 48, ["t"] * 48, kinds, [layer.keys[0] for layer in cache.layers],
                        [layer.values[0] for layer in cache.layers])
    view = inspect_capture(capture, TIERS["pca-8x"], layer=2, calibration=calib)
    assert view.head.archived == (0, 48) and 0 < view.layers[2].key_rel_error < 1
    assert view.layers[0].key_rel_error == 0, "sliding layers stay native"
    share = view.channels.key_share
    assert share.shape == (6, 64) and torch.all(share[:, 1:] >= share[:, :-1] - 1e-6)
    assert abs(float(share[2, -1]) - 1) < 1e-4 and sorted(view.channels.bits) == [2, 5]
    assert len(channel_spectrum_figure(view.channels).data) == 6 + 6 + 2
    with pytest.raises(ValueError, match="needs the model's calibration"):
        inspect_capture(capture, TIERS["pca-8x"], layer=2)
