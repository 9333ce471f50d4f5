"""decode_attention: new queries attend directly on stored codes; the (S, D) keys and values never exist.

The sequence is a list of segments in order: `Coded` spans (an archive as its key and value codecs
stored it) and `Raw` spans (sinks, the raw tail, the recent window, the new tokens). With a stored
row layout x[b*r + n] = (sum_j M[j, n] row[b*k + j]) @ Q.T (kernels/layout.py):

    scores   q . x[b*r + n] = sum_j ((q Q) . row[b*k + j]) M[j, n]    rotate q once, stay in row domain
    output   sum_p w[p] x[p] = (sum_b sum_j (w_b M.T)[j] row[b*k + j]) @ Q.T    un-rotate the output once

so a DCT tier touches k/r of the rows per token and a rotation tier never leaves the rotated domain.
Raw values are rotated into the value domain once (they are few).

Triton (flash-decoding): grid (B * Hkv, splits, query-row programs); every program runs an online
softmax over its split's tiles for up to MAX_QUERY_ROWS of the G*T query rows of one KV head (GQA: query
head = kv head * G + g) and writes a partial (max, sum, acc); the raw segments are one more launch of
the same kernel with r = k = 1 and raw loads; `_combine_kernel` merges the partials. A tile is BLOCK_NB
blocks: row j of its 8 blocks is dequantized in registers (8 x D float32 per side), then meets the query
rows in tl.dot on float32 with input_precision="ieee" (CUDA-core FMAs, float32 exact; 8 is the smallest
k it takes, and m, the query rows, may be 1). No software pipelining (num_stages=1): the loads feed
dequantization, not the dot, and pipelining them doubled the registers and spilled (measured with
python -m kernels.compile_check, whose CSV assets/kernels-resources.csv lists every configuration); the
6 to 12 programs an SM then holds hide the latency. The torch reference streams the same math chunk
by chunk (CHUNK_TOKENS), so it also never holds more than one chunk of dequantized rows, and it
additionally takes a mask (any T, padding, causal prefill); the Triton path runs without a mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from codeckv.codecs.layout import Codec, Encoded, NoRowLayout, QuantRows, RowLayout, slice_encoded

from .layout import basis, layout_of, levels, rotation, rows, synthesis_basis, tensors
from .segments import Coded, Raw, Segment, geometry, value_rotation
from .triton_helpers import Launch, load_rows, loadable, pow2, quant_meta, row_strides

CHUNK_TOKENS = 1024  # tokens per step of the reference (rounded to whole blocks)
BLOCK_NB = 8  # blocks per tile: the smallest k tl.dot takes for float32 (module docstring)
NUM_WARPS = 4
MAX_QUERY_ROWS = 16  # query rows per program; a KV head with more (G * T > 16) takes several programs per tile
COMBINE_SPLITS = 32  # partial slots the combine reads at once
TARGET_PROGRAMS = 1024  # splits are chosen so that B * Hkv * splits reaches about this many programs
LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class _RowReader:
    """How the reference reads one side of a Coded span: the declared rows, or the codec's own decode."""

    codec: Codec
    layout: RowLayout  # a codec without a row layout is read as raw decoded tokens (r = k = 1, no rotation)
    declared: bool

    @staticmethod
    def of(codec: Codec) -> _RowReader:
        layout = layout_of(codec)
        if isinstance(layout, NoRowLayout):
            return _RowReader(codec, RowLayout(QuantRows(8, 1, False)), False)
        return _RowReader(codec, layout, True)

    def rows(self, enc: Encoded, start: int, stop: int) -> torch.Tensor:
        """(B, H, n_rows, D) float32 rows of tokens [start, stop)."""
        if self.declared:
            return rows(self.layout, enc, start, stop)
        return self.codec.decode(slice_encoded(enc, start, stop)).float()


# ----------------------------------------------------------------------------------------------------------------
# Torch reference


class _OnlineSoftmax:
    """Running max / sum / weighted values over chunks of scores (B, Hkv, G, T, n)."""

    def __init__(self, shape: tuple[int, ...], dv: int, device: torch.device) -> None:
        self.m = torch.full(shape, -math.inf, device=device)
        self.l = torch.zeros(shape, device=device)
        self.acc = torch.zeros((*shape, dv), device=device)

    def weights(self, scores: torch.Tensor) -> torch.Tensor:
        """Fold a chunk's scores in; rescale the accumulator; return the chunk's unnormalized weights."""
        m = torch.maximum(self.m, scores.amax(-1))
        m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # rows that have seen nothing yet
        alpha = torch.exp(self.m - m_safe)
        p = torch.exp(scores - m_safe.unsqueeze(-1))
        self.l = self.l * alpha + p.sum(-1)
        self.acc *= alpha.unsqueeze(-1)
        self.m = m
        return p

    def result(self) -> torch.Tensor:
        return self.acc / self.l.unsqueeze(-1)


def _bias(mask: torch.Tensor | None, b: int, hkv: int, g: int, t: int) -> torch.Tensor | None:
    """An additive float32 bias (B, Hkv|1, G|1, T, S) from a bool (True = attend) or additive mask."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, device=mask.device).masked_fill_(~mask, -math.inf)
    mask = mask.float().expand(b, -1, t, -1)
    if mask.shape[1] == 1:
        return mask.unsqueeze(1)
    return mask.reshape(b, hkv, g, t, mask.shape[-1])


def _to_tokens(rows_weights: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """Row-domain scores (..., nblk*k) -> token scores (..., nblk*r): per block, (..., k) @ M (k, r)."""
    k, r = basis.shape
    if k == r == 1:
        return rows_weights
    lead = rows_weights.shape[:-1]
    return (rows_weights.reshape(*lead, -1, k) @ basis).reshape(*lead, -1)


def _to_rows(token_weights: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """Token weights (..., nblk*r) -> row weights (..., nblk*k): per block, (..., r) @ M.T."""
    k, r = basis.shape
    if k == r == 1:
        return token_weights
    lead = token_weights.shape[:-1]
    return (token_weights.reshape(*lead, -1, r) @ basis.T).reshape(*lead, -1)


def decode_attention_ref(
    query: torch.Tensor,
    segments: list[Segment],
    scale: float | None = None,
    mask: torch.Tensor | None = None,
    chunk_tokens: int = CHUNK_TOKENS,
) -> torch.Tensor:
    """Attention of query (B, Hq, T, D) on the segments, chunk by chunk in the row domain: (B, Hq, T, Dv).

    mask: None (every query sees every token) or (B, 1|Hq, T, S) bool (True = attend) / additive float,
    S = the segments' tokens in order. Peak extra memory is one chunk of rows, not the (S, D) tensors.
    """
    b, hq, t, d = query.shape
    hkv, dv = geometry(segments)
    g = hq // hkv
    scale = d**-0.5 if scale is None else scale
    device = query.device
    q = query.float().reshape(b, hkv, g, t, d)
    v_rot = value_rotation(segments, dv, device)
    bias = _bias(mask, b, hkv, g, t)
    state = _OnlineSoftmax((b, hkv, g, t), dv, device)
    pos = 0
    for seg in segments:
        if isinstance(seg, Raw):
            for lo in range(0, seg.tokens, chunk_tokens):
                hi = min(seg.tokens, lo + chunk_tokens)
                s = torch.einsum("bhgtd,bhnd->bhgtn", q, seg.keys[:, :, lo:hi].float()) * scale
                if bias is not None:
                    s = s + bias[..., pos + lo : pos + hi]
                values = seg.values[:, :, lo:hi].float()
                values = values if v_rot is None else values @ v_rot
                state.acc += torch.einsum("bhgtn,bhnd->bhgtd", state.weights(s), values)
        else:
            kr, vr = _RowReader.of(seg.key_codec), _RowReader.of(seg.value_codec)
            k_rot = rotation(kr.layout, d, device)
            qk = q if k_rot is None else q @ k_rot
            mk, mv = basis(kr.layout, device), basis(vr.layout, device)
            unit = math.lcm(seg.key_codec.block_tokens, seg.value_codec.block_tokens, kr.layout.block, vr.layout.block)
            step = max(unit, chunk_tokens // unit * unit)
            for lo in range(0, seg.tokens, step):
                hi = min(seg.tokens, lo + step)
                key_rows = kr.rows(seg.keys, lo, hi)  # (B, Hkv, nblk*k, D)
                s = _to_tokens(torch.einsum("bhgtd,bhrd->bhgtr", qk, key_rows), mk) * scale
                if bias is not None:
                    s = s + bias[..., pos + lo : pos + hi]
                weights = _to_rows(state.weights(s), mv)
                state.acc += torch.einsum("bhgtr,bhrd->bhgtd", weights, vr.rows(seg.values, lo, hi))
        pos += seg.tokens
    out = state.result()
    if v_rot is not None:
        out = out @ v_rot.T
    return out.reshape(b, hq, t, dv).to(query.dtype)


# ----------------------------------------------------------------------------------------------------------------
# Triton


@triton.jit(do_not_specialize=["nq", "rows_p", "n_blocks", "blocks_per_split", "split_base", "n_split_total"])
def _decode_attention_kernel(
    q_ptr,  # (B, Hkv, nq, D) float32 query rows, contiguous, in the key domain (rotated when the keys are)
    k_rows, k_scale, k_offset, k_lut,  # keys: codes | raw rows; fp16 scale; fp16 zero; Lloyd-Max levels
    k_sb, k_sh, k_sr, ks_sb, ks_sh, ks_sr,  # key rows and key scale strides (batch, head, row)
    v_rows, v_scale, v_offset, v_lut,  # values, same roles
    v_sb, v_sh, v_sr, vs_sb, vs_sh, vs_sr,
    basis_ptr,  # (K, R) float32 synthesis basis M ([[1.]] for r = k = 1)
    m_ptr, l_ptr, acc_ptr,  # partials (B*Hkv, n_split_total, rows_p) and (B*Hkv, n_split_total, rows_p, DV_P)
    n_heads, nq, rows_p,  # Hkv; query rows per KV head (G * T); the partials' rows (nq padded to whole programs)
    n_blocks, blocks_per_split,  # blocks in this launch, blocks per program (a multiple of BLOCK_NB)
    split_base, n_split_total,  # this launch's first partial slot, slots per (b, kv head)
    qk_scale,  # softmax scale * log2(e): scores live in the exp2 domain
    NQ_P: tl.constexpr,  # query rows per program (a power of two, at most MAX_QUERY_ROWS)
    D: tl.constexpr, D_P: tl.constexpr, DV: tl.constexpr, DV_P: tl.constexpr,
    K: tl.constexpr, R: tl.constexpr, R_P: tl.constexpr, BLOCK_NB: tl.constexpr,  # rows / tokens per block, tile
    K_RAW: tl.constexpr, K_BITS: tl.constexpr, K_GROUP: tl.constexpr, K_PER_CHANNEL: tl.constexpr,
    K_HAS_OFFSET: tl.constexpr, K_LLOYD: tl.constexpr, K_RAW_FMT: tl.constexpr, K_SCALE_FMT: tl.constexpr,
    V_RAW: tl.constexpr, V_BITS: tl.constexpr, V_GROUP: tl.constexpr, V_PER_CHANNEL: tl.constexpr,
    V_HAS_OFFSET: tl.constexpr, V_LLOYD: tl.constexpr, V_RAW_FMT: tl.constexpr, V_SCALE_FMT: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    b = (pid_bh // n_heads).to(tl.int64)
    h = (pid_bh % n_heads).to(tl.int64)
    start = split * blocks_per_split
    end = tl.minimum(start + blocks_per_split, n_blocks)

    rows = tl.program_id(2) * NQ_P + tl.arange(0, NQ_P)  # this program's query rows
    qi = rows[:, None]
    dk = tl.arange(0, D_P)[None, :]
    dv = tl.arange(0, DV_P)[None, :]
    q = tl.load(q_ptr + (pid_bh * nq + qi) * D + dk, mask=(qi < nq) & (dk < D), other=0.0)  # (NQ_P, D_P)
    n_tok = tl.arange(0, R_P)  # token within a block
    k_base = k_rows + b * k_sb + h * k_sh
    ks_base = b * ks_sb + h * ks_sh
    v_base = v_rows + b * v_sb + h * v_sh
    vs_base = b * vs_sb + h * vs_sh

    m_i = tl.full((NQ_P,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((NQ_P,), dtype=tl.float32)
    acc = tl.zeros((NQ_P, DV_P), dtype=tl.float32)
    for b0 in range(start, end, BLOCK_NB):
        blk = b0 + tl.arange(0, BLOCK_NB)  # (NB,) blocks of this tile
        ok = (blk < end)[:, None]
        s = tl.zeros((NQ_P, BLOCK_NB, R_P), dtype=tl.float32)
        for j in range(K):  # q . token n of a block = sum_j (q . row j) M[j, n]: row j of every block at once
            kc = load_rows(k_base, k_scale + ks_base, k_offset + ks_base, k_lut, blk[:, None] * K + j, dk,
                           ok & (dk < D), k_sr, ks_sr, K_RAW, K_BITS, K_GROUP, K_PER_CHANNEL, K_HAS_OFFSET,
                           K_LLOYD, K_RAW_FMT, K_SCALE_FMT)  # (NB, D_P)
            qc = tl.dot(q, tl.trans(kc), input_precision="ieee")  # (NQ_P, NB)
            mj = tl.load(basis_ptr + j * R + n_tok, mask=n_tok < R, other=0.0)  # (R_P,)
            s += qc[:, :, None] * mj[None, None, :]
        tok_ok = (blk < end)[None, :, None] & (n_tok < R)[None, None, :]
        s = tl.where(tok_ok, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(tl.max(s, axis=2), axis=1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None, None])  # (NQ_P, NB, R_P)
        l_i = l_i * alpha + tl.sum(tl.sum(p, axis=2), axis=1)
        acc = acc * alpha[:, None]
        for j in range(K):  # weighted values: row j of each block weighs sum_n p[n] M[j, n]
            mj = tl.load(basis_ptr + j * R + n_tok, mask=n_tok < R, other=0.0)
            pc = tl.sum(p * mj[None, None, :], axis=2)  # (NQ_P, NB)
            vc = load_rows(v_base, v_scale + vs_base, v_offset + vs_base, v_lut, blk[:, None] * K + j, dv,
                           ok & (dv < DV), v_sr, vs_sr, V_RAW, V_BITS, V_GROUP, V_PER_CHANNEL, V_HAS_OFFSET,
                           V_LLOYD, V_RAW_FMT, V_SCALE_FMT)  # (NB, DV_P)
            acc += tl.dot(pc, vc, input_precision="ieee")
        m_i = m_new

    slot = (pid_bh * n_split_total + split_base + split) * rows_p
    tl.store(m_ptr + slot + rows, m_i)
    tl.store(l_ptr + slot + rows, l_i)
    tl.store(acc_ptr + (slot + qi) * DV_P + dv, acc)


@triton.jit(do_not_specialize=["nq", "rows_p", "n_split"])
def _combine_kernel(
    m_ptr, l_ptr, acc_ptr,  # partials of _decode_attention_kernel (max in the exp2 domain, sum, weighted values)
    out_ptr,  # (B*Hkv, nq, DV) float32
    nq, rows_p, n_split,  # query rows per KV head, the partials' rows per slot, partial slots per (b, head)
    DV: tl.constexpr, DV_P: tl.constexpr, BLOCK_S: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    row = tl.program_id(1)
    base = pid_bh * n_split
    sp = tl.arange(0, BLOCK_S)
    m_run = tl.full((BLOCK_S,), float("-inf"), dtype=tl.float32)
    for s0 in range(0, n_split, BLOCK_S):
        m = tl.load(m_ptr + (base + s0 + sp) * rows_p + row, mask=s0 + sp < n_split, other=float("-inf"))
        m_run = tl.maximum(m_run, m)
    m_all = tl.max(m_run, axis=0)
    dv = tl.arange(0, DV_P)
    l_run = tl.zeros((BLOCK_S,), dtype=tl.float32)
    o = tl.zeros((DV_P,), dtype=tl.float32)
    for s0 in range(0, n_split, BLOCK_S):
        ok = s0 + sp < n_split
        slot = (base + s0 + sp) * rows_p + row
        w = tl.where(ok, tl.math.exp2(tl.load(m_ptr + slot, mask=ok, other=float("-inf")) - m_all), 0.0)
        l_run += w * tl.load(l_ptr + slot, mask=ok, other=0.0)
        a = tl.load(acc_ptr + slot[:, None] * DV_P + dv[None, :], mask=ok[:, None], other=0.0)
        o += tl.sum(a * w[:, None], axis=0)
    tl.store(out_ptr + (pid_bh * nq + row) * DV + dv, o / tl.sum(l_run, axis=0), mask=dv < DV)


def decode_attention_supported(segments: list[Segment]) -> bool:
    """True when the Triton path handles these segments: at most one Coded span whose key and value
    layouts the kernel reads and share a block geometry (every tier in codeckv.tiers except png)."""
    coded = [s for s in segments if isinstance(s, Coded)]
    if len(coded) > 1:
        return False
    for seg in coded:
        kl, vl = layout_of(seg.key_codec), layout_of(seg.value_codec)
        if not (isinstance(kl, RowLayout) and isinstance(vl, RowLayout) and (kl.block, kl.k) == (vl.block, vl.k)):
            return False
    return True


def _splits(n_blocks: int, block_nb: int, programs_per_split: int, num_splits: int | None) -> tuple[int, int]:
    """(blocks per split, splits): whole tiles per split, about TARGET_PROGRAMS programs in all."""
    tiles = triton.cdiv(n_blocks, block_nb)
    wanted = num_splits if num_splits is not None else triton.cdiv(TARGET_PROGRAMS, programs_per_split)
    per_split = triton.cdiv(tiles, max(1, min(wanted, tiles))) * block_nb
    return per_split, triton.cdiv(n_blocks, per_split)


@dataclass(frozen=True)
class _Stream:
    """One side (keys or values) of a launch, as _decode_attention_kernel reads it."""

    rows: torch.Tensor  # codes (B, H, N, D*bits/8) or raw rows (B, H, N, D)
    scale: torch.Tensor | None  # fp16 scales (None for raw rows)
    zero: torch.Tensor | None  # fp16 zeros (GroupQuant only)
    spec: QuantRows | None  # None for raw rows

    @staticmethod
    def coded(layout: RowLayout, enc: Encoded) -> _Stream:
        return _Stream(*tensors(layout, enc), layout.quant)

    def args(self, device: torch.device) -> list:
        """rows, scale, zero, levels pointers (8-bit floats as bytes), then the rows' and the scale's (batch, head,
        row) strides."""
        scale = self.rows if self.scale is None else self.scale  # placeholders are never read
        zero = scale if self.zero is None else self.zero
        table = levels(self.spec, device) if self.spec is not None else synthesis_basis(1, 1, device)
        return [loadable(self.rows), loadable(scale), loadable(zero), table, *row_strides(self.rows),
                *row_strides(scale)]

    def meta(self, prefix: str) -> dict[str, int | bool]:
        """The stream's constexprs (quant_meta)."""
        return quant_meta(self.spec, prefix, self.rows, self.scale)


def decode_attention_launches(
    query: torch.Tensor, segments: list[Segment], scale: float | None = None, num_splits: int | None = None
) -> tuple[list[Launch], torch.Tensor]:
    """The launches of decode_attention_triton, in order, and the (B*Hkv, NQ, Dv) float32 output the last fills
    (the weighted values in the values' domain: decode_attention_triton rotates them back)."""
    if not decode_attention_supported(segments):
        raise ValueError("decode_attention_triton: these segments need the reference (see decode_attention_supported)")
    b, hq, t, d = query.shape
    hkv, dv = geometry(segments)
    nq = hq // hkv * t
    nq_p, d_p, dv_p = min(pow2(nq), MAX_QUERY_ROWS), pow2(d), pow2(dv)
    row_programs = triton.cdiv(nq, nq_p)  # programs sharing a tile, each with nq_p query rows
    rows_p = row_programs * nq_p
    device = query.device
    scale = d**-0.5 if scale is None else scale
    q = query.float().reshape(b, hkv, nq, d)  # query head = kv head * G + g: rows g-major, then t
    v_rot = value_rotation(segments, dv, device)

    sources = []  # (query rows in the key domain, key stream, value stream, basis M, blocks, wanted splits)
    for seg in segments:
        if isinstance(seg, Coded) and seg.tokens:
            kl, vl = layout_of(seg.key_codec), layout_of(seg.value_codec)
            k_rot = rotation(kl, d, device)
            qk = q if k_rot is None else q @ k_rot
            sources.append((qk, _Stream.coded(kl, seg.keys), _Stream.coded(vl, seg.values), basis(kl, device),
                            seg.tokens // kl.block, num_splits))
    raws = [seg for seg in segments if isinstance(seg, Raw) and seg.tokens]
    if raws:  # one more launch over every raw token, values rotated into the value domain
        keys = torch.cat([seg.keys for seg in raws], dim=2)
        values = torch.cat([seg.values for seg in raws], dim=2).float()
        values = values if v_rot is None else values @ v_rot
        sources.append((q, _Stream(keys, None, None, None), _Stream(values, None, None, None),
                        synthesis_basis(1, 1, device), keys.shape[2], None))

    plans = []  # source + (blocks per split, splits)
    for source in sources:
        n_blocks, wanted = source[4:]
        plans.append((*source[:5], *_splits(n_blocks, BLOCK_NB, b * hkv * row_programs, wanted)))
    total = sum(plan[-1] for plan in plans)
    part_m = torch.empty((b * hkv, total, rows_p), dtype=torch.float32, device=device)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty((b * hkv, total, rows_p, dv_p), dtype=torch.float32, device=device)

    launches = []
    slot = 0
    for qk, keys, values, m, n_blocks, per_split, n_split in plans:
        k, r = m.shape
        launches.append(Launch(_decode_attention_kernel, (b * hkv, n_split, row_programs), (
            qk.contiguous(), *keys.args(device), *values.args(device), m, part_m, part_l, part_acc,
            hkv, nq, rows_p, n_blocks, per_split, slot, total, scale * LOG2E,
        ), dict(
            NQ_P=nq_p, D=d, D_P=d_p, DV=dv, DV_P=dv_p, K=k, R=r, R_P=pow2(r),
            BLOCK_NB=BLOCK_NB, **keys.meta("K_"), **values.meta("V_"),
            num_warps=NUM_WARPS, num_stages=1,  # no software pipelining (module docstring)
        )))
        slot += n_split

    out = torch.empty((b * hkv, nq, dv), dtype=torch.float32, device=device)
    launches.append(Launch(_combine_kernel, (b * hkv, nq), (part_m, part_l, part_acc, out, nq, rows_p, total),
                           dict(DV=dv, DV_P=dv_p, BLOCK_S=COMBINE_SPLITS)))
    return launches, out


def decode_attention_triton(
    query: torch.Tensor, segments: list[Segment], scale: float | None = None, num_splits: int | None = None
) -> torch.Tensor:
    """Flash-decoding on the stored codes: (B, Hq, T, D) queries, every query sees every token -> (B, Hq, T, Dv).

    num_splits: splits of the coded span (default: enough for about TARGET_PROGRAMS programs).
    """
    launches, out = decode_attention_launches(query, segments, scale, num_splits)
    for launch in launches:
        launch()
    b, hq, t, _ = query.shape
    hkv, dv = geometry(segments)
    v_rot = value_rotation(segments, dv, query.device)
    if v_rot is not None:
        out = out @ v_rot.T
    return out.reshape(b, hq, t, dv).to(query.dtype)
