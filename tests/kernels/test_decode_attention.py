"""decode_attention on stored codes equals decode-then-SDPA (fp32, 1e-4): Triton under the interpreter, the chunked
torch reference and the fast torch path, over tiers, GQA groups, odd lengths, raw sink / tail segments, splits, chunks,
query blocks and masks."""

import math

import pytest
import torch
import torch.nn.functional as F

import kernels.coded_side as coded_side
import kernels.decode_attention_torch as fast
from codeckv.codecs import DCT, GroupQuant
from codeckv.custom_tier import custom_tier
from codeckv.tiers import TIERS
from kernels import Coded, Raw, ops
from kernels.decode_attention import (
    MAX_QUERY_ROWS,
    decode_attention_ref,
    decode_attention_supported,
    decode_attention_triton,
)
from kernels.decode_attention_torch import decode_attention_torch, decode_attention_torch_supported
from kernels.layout import layout_of

ATOL = RTOL = 1e-4
R6_GQ4 = DCT(block_size=6, k=3, coeffs=GroupQuant(bits=4, group=16))
DCT_ROTATED = custom_tier(k=4, bits=4, rotation=True, lloyd_max=True)  # DCT over Rotation(LloydMaxQuant)
CODECS = {  # name -> (key codec, value codec, head_dim)
    **{name: (TIERS[name].key, TIERS[name].value, 64)
       for name in ("jpeg-k2-int8", "jpeg-k8-int8", "jpeg-k4", "int8", "turbo-4", "turbo-3", "turbo-k4v2",
                    "fp8-e4m3", "fp8-e5m2", "nvfp4", "mxfp4")},  # fp8 rows and fp8 / e8m0 scales read as bytes
    "fp8-keys-nvfp4-values": (TIERS["fp8-e4m3"].key, TIERS["nvfp4"].value, 64),
    "r6-k3-gq4-d48": (R6_GQ4, R6_GQ4, 48),
    "dct-k4-rotated-lloyd-max": (DCT_ROTATED.key, DCT_ROTATED.value, 64),
    "dct-keys-rotated-values": (TIERS["jpeg-k2-int8"].key, TIERS["turbo-4"].value, 64),  # different layouts
    "rotated-4": (TIERS["rotated-4"].key, TIERS["rotated-4"].value, 64),  # planar 4-bit codes, rotated values
    "2bit-channel-keys-2bit-values-d48": (GroupQuant(bits=2, group=16, per_channel=True), GroupQuant(bits=2, group=8),
                                          48),  # 4 planes per byte
    "4bit-group3-d48": (GroupQuant(bits=4, group=3), GroupQuant(bits=4, group=3), 48),  # odd groups: gathered
}
SHAPES = {  # name -> (B, KV heads, group, queries T, archived units, raw sink tokens, raw tail tokens, splits)
    "one-row": (1, 1, 1, 1, 1, 0, 1, 1),
    "gqa3-odd": (2, 2, 3, 1, 5, 3, 7, 3),
}


def _segments(key_codec, value_codec, head_dim, b, hkv, units, sinks, tail, random_kv):
    s = units * math.lcm(key_codec.block_tokens, value_codec.block_tokens)
    keys, values = random_kv((b, hkv, s, head_dim), seed=1), random_kv((b, hkv, s, head_dim), seed=2)
    segments = [Coded(key_codec, key_codec.encode(keys), value_codec, value_codec.encode(values))]
    if sinks:
        segments.insert(0, Raw(random_kv((b, hkv, sinks, head_dim), seed=3), random_kv((b, hkv, sinks, head_dim), 4)))
    segments.append(Raw(random_kv((b, hkv, tail, head_dim), seed=5), random_kv((b, hkv, tail, head_dim), seed=6)))
    return segments


def _materialized(query, segments, scale, mask=None):
    """Decode everything, then SDPA: the (S, D) tensors the kernels avoid."""
    keys, values = [], []
    for seg in segments:
        if isinstance(seg, Raw):
            keys.append(seg.keys)
            values.append(seg.values)
        else:
            keys.append(seg.key_codec.decode(seg.keys))
            values.append(seg.value_codec.decode(seg.values))
    k, v = torch.cat(keys, 2).float(), torch.cat(values, 2).float()
    return F.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("codecs", CODECS.values(), ids=CODECS.keys())
def test_triton_and_reference_match_materialized_attention(codecs, shape, random_kv, monkeypatch):
    key_codec, value_codec, d = codecs
    b, hkv, g, t, units, sinks, tail, splits = shape
    segments = _segments(key_codec, value_codec, d, b, hkv, units, sinks, tail, random_kv)
    query = random_kv((b, hkv * g, t, d), seed=7)
    want = _materialized(query, segments, 0.1)
    ref = decode_attention_ref(query, segments, 0.1, chunk_tokens=16)  # several chunks
    torch.testing.assert_close(ref, want, atol=ATOL, rtol=RTOL, msg="reference vs decode + SDPA")
    monkeypatch.setattr(fast, "ROWS_BYTES", 1)  # one archive unit per piece: several pieces in one pass
    assert decode_attention_torch_supported(segments)
    torch.testing.assert_close(decode_attention_torch(query, segments, 0.1), want, atol=ATOL, rtol=RTOL,
                               msg="fast torch path vs decode + SDPA")
    if layout_of(key_codec).block != layout_of(value_codec).block:
        assert not decode_attention_supported(segments), "the Triton kernel needs one block geometry for K and V"
        return
    assert decode_attention_supported(segments)
    got = decode_attention_triton(query, segments, 0.1, num_splits=splits)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL, msg="Triton vs decode + SDPA")


def test_triton_several_queries_per_row_and_raw_only(random_kv):
    segments = _segments(TIERS["turbo-4"].key, TIERS["turbo-4"].value, 64, 1, 2, 1, 2, 5, random_kv)
    query = random_kv((1, 6, 2, 64), seed=8)  # T = 2 queries that see every token
    torch.testing.assert_close(decode_attention_triton(query, segments), _materialized(query, segments, None),
                               atol=ATOL, rtol=RTOL)
    raw_only = [segments[0], segments[2]]
    torch.testing.assert_close(decode_attention_triton(query, raw_only), _materialized(query, raw_only, None),
                               atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("tier", ["turbo-4", "jpeg-k2-int8"])
def test_triton_splits_many_query_rows_over_programs(tier, random_kv):
    """G * T = 20 query rows per KV head (a multi-query model), more than one program holds: two per tile."""
    assert MAX_QUERY_ROWS < 20
    codecs = TIERS[tier]
    segments = _segments(codecs.key, codecs.value, 64, 1, 1, 2, 1, 3, random_kv)
    query = random_kv((1, 10, 2, 64), seed=13)
    torch.testing.assert_close(decode_attention_triton(query, segments, num_splits=2),
                               _materialized(query, segments, None), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("tier", ["png", "turbo-4", "jpeg-k2-int8"])
def test_reference_with_causal_and_padding_masks(tier, random_kv):
    codecs = TIERS[tier]
    segments = _segments(codecs.key, codecs.value, 64, 2, 1, 3, 2, 6, random_kv)
    s = sum(seg.keys.shape[2] for seg in segments)
    t = 4
    query = random_kv((2, 3, t, 64), seed=9)
    pos = torch.arange(s, device=query.device)
    mask = (pos[None, :] <= pos[s - t :, None]).expand(2, 1, t, s).clone()  # causal, last t tokens are queries
    mask[0, :, :, :5] = False  # left padding of batch row 0
    want = _materialized(query, segments, None, mask)
    torch.testing.assert_close(decode_attention_ref(query, segments, mask=mask, chunk_tokens=8), want,
                               atol=ATOL, rtol=RTOL)
    additive = torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, -math.inf)
    torch.testing.assert_close(decode_attention_ref(query, segments, mask=additive), want, atol=ATOL, rtol=RTOL)
    if decode_attention_torch_supported(segments):
        torch.testing.assert_close(decode_attention_torch(query, segments, mask=mask), want, atol=ATOL, rtol=RTOL)


def test_fast_path_takes_queries_in_blocks_under_a_small_score_budget(random_kv, monkeypatch):
    """A long prefill through a materialization-free layer: scores of all T queries would not fit the budget."""
    codecs = TIERS["turbo-4"]
    segments = _segments(codecs.key, codecs.value, 64, 1, 2, 2, 3, 9, random_kv)
    s = sum(seg.tokens for seg in segments)
    t = 9
    query = random_kv((1, 4, t, 64), seed=11)
    pos = torch.arange(s, device=query.device)
    mask = (pos[None, :] <= pos[s - t :, None]).expand(1, 1, t, s)
    monkeypatch.setattr(fast, "SCORE_BYTES", 1)  # one piece per pass: passes merged by the online softmax
    torch.testing.assert_close(decode_attention_torch(query, segments, mask=mask),
                               _materialized(query, segments, None, mask), atol=ATOL, rtol=RTOL)


def test_png_needs_the_reference_and_the_public_op_picks_it(random_kv):
    segments = _segments(TIERS["png"].key, TIERS["png"].value, 64, 1, 2, 2, 0, 3, random_kv)
    query = random_kv((1, 4, 1, 64), seed=10)
    assert not decode_attention_supported(segments) and not decode_attention_torch_supported(segments)
    torch.testing.assert_close(ops.decode_attention(query, segments), _materialized(query, segments, None),
                               atol=ATOL, rtol=RTOL)


def test_fast_path_runs_inside_and_outside_inference_mode(random_kv, monkeypatch):
    """Its reused scratch buffers are first made inside inference mode, then written outside it (and back)."""
    monkeypatch.setattr(coded_side, "SCRATCH", coded_side.Scratch())
    codecs = TIERS["turbo-4"]
    segments = _segments(codecs.key, codecs.value, 64, 1, 2, 2, 0, 3, random_kv)
    query = random_kv((1, 4, 1, 64), seed=12)
    with torch.inference_mode():
        inside = decode_attention_torch(query, segments)
    outside = decode_attention_torch(query, segments)
    torch.testing.assert_close(outside, inside, atol=0, rtol=0)
    torch.testing.assert_close(outside, _materialized(query, segments, None), atol=ATOL, rtol=RTOL)
