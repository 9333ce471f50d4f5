"""decode_attention_torch: attention on stored codes for the CPU, in few large torch ops and bounded memory.

Same math as the reference in decode_attention.py (scores and weighted values in the row domain of each
codec: q . x = (q Q) . row weighted by M, sum_p w[p] x[p] = ((w M.T) . rows) Q.T), organised for speed:

    pass 1  scores of every token -> one (B, Hkv, G*T, S) float32 buffer: raw spans by one matmul, coded
            spans chunk by chunk: codes -> levels in a reused float32 buffer (one gather per byte from a
            256-entry table that unpacks and looks up at once), per-channel scales and zeros folded into
            the queries (per-token ones applied in place), one matmul with the rotated queries, one with M
    softmax mask added, max subtracted, exp in place; the sum is divided out at the end
    pass 2  weighted values, chunk by chunk the same way: (w M.T) @ rows accumulated in the value domain

A chunk's float32 rows take about CHUNK_FRACTION of the archive's bytes, between MIN_CHUNK_BYTES and
MAX_CHUNK_BYTES (so that they stay in the L2 cache between the gather and the matmul): the extra memory
of a call is a fraction of the archive, whatever the context. Queries are taken in blocks when the score
buffer would exceed SCORE_FRACTION of the archive (long prefills). Handles any T,
GQA, masks, raw segments anywhere, different key and value layouts; a codec without a row layout (png)
is the reference's job (`decode_attention_torch_supported`).
"""

from __future__ import annotations

import functools
import math

import torch

from codeckv.codecs.layout import Encoded, RowLayout

from .decode_attention import Coded, Raw, Segment, _bias, _geometry, _value_rotation
from .layout import basis, layout_of, levels, rotation, rows, tensors

CHUNK_FRACTION = 1 / 2  # float32 rows of one chunk, as a fraction of the archive's bytes
MIN_CHUNK_BYTES = 1 << 18  # ... but at least this many bytes of float32 rows per chunk
MAX_CHUNK_BYTES = 1 << 20  # ... and at most this many, so that a chunk's rows stay in the L2 cache
SCORE_FRACTION = 1 / 2  # the score buffer of one block of queries, as a fraction of the archive
MIN_SCORE_BYTES = 4 << 20


def decode_attention_torch_supported(segments: list[Segment]) -> bool:
    """True when every coded span's key and value codecs declare a row layout."""
    return all(
        isinstance(layout_of(codec), RowLayout)
        for seg in segments if isinstance(seg, Coded) for codec in (seg.key_codec, seg.value_codec)
    )


@functools.cache
def _byte_table(values: tuple[float, ...], bits: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """(level[code] of every code of a byte, codes per byte) as one 8- or 16-byte element per byte value.

    Indexing it with the stored bytes unpacks and dequantizes in one gather: a 4-bit byte becomes two
    float32 (one int64), a 2-bit byte four (one complex128), an 8-bit byte one float32.
    """
    per_byte = 8 // bits
    byte = torch.arange(256)
    mask = (1 << bits) - 1
    table = torch.tensor(values, dtype=torch.float32)
    pairs = torch.stack([table[(byte >> (i * bits)) & mask] for i in range(per_byte)], dim=1).contiguous()
    view = {1: torch.float32, 2: torch.int64, 4: torch.complex128}[per_byte]
    return pairs.view(view).view(256).to(device), per_byte


class _Rows:
    """One side (keys or values) of a coded span, read chunk by chunk as float32 rows into a reused buffer."""

    def __init__(self, codec, enc: Encoded, head_dim: int, device: torch.device, chunk_rows: int) -> None:
        self.layout: RowLayout = layout_of(codec)
        self.enc = enc
        self.data, self.scale, self.offset = tensors(self.layout, enc)
        self.spec = self.layout.quant
        self.m = basis(self.layout, device)  # (k, r)
        self.q = rotation(self.layout, head_dim, device)
        b, h = enc.shape[:2]
        self.shape = (b, h, head_dim)
        self.buffer = torch.empty(b * h * chunk_rows * head_dim, dtype=torch.float32, device=device)
        self.table = self.index = None  # byte -> levels table and the int32 indices it is read with
        spec = self.spec
        if spec is not None and spec.bits != 3 and (spec.bits != 8 or spec.lloyd_max):
            self.table, _ = _byte_table(tuple(levels(spec, device).tolist()), spec.bits, device)
            self.index = torch.empty(b * h * chunk_rows * self.data.shape[-1], dtype=torch.int32, device=device)

    def _out(self, n: int) -> torch.Tensor:
        """The buffer as (B, H, n, D) rows: a contiguous view, whatever n."""
        b, h, d = self.shape
        return self.buffer[: b * h * n * d].view(b, h, n, d)

    def _levels(self, r0: int, r1: int) -> torch.Tensor:
        """level[code] (or the raw values) of rows [r0, r1): (B, H, n, D) float32 in the buffer."""
        out = self._out(r1 - r0)
        stored = self.data[:, :, r0:r1]
        if self.table is None:
            return out.copy_(stored)  # raw rows (any float dtype) or 8-bit integer codes
        index = self.index[: stored.numel()]  # one gather unpacks and looks up: byte -> its codes' levels
        index.view(stored.shape).copy_(stored)
        torch.index_select(self.table, 0, index, out=out.view(self.table.dtype).view(-1))
        return out

    def _stats(self, r0: int, r1: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Scale and offset (or None) of rows [r0, r1), float32: (B, H, n/g, D) per channel, (B, H, n, D/g) else."""
        spec = self.spec
        lo, hi = (r0 // spec.group, r1 // spec.group) if spec.per_channel else (r0, r1)
        offset = None if spec.offset is None else self.offset[:, :, lo:hi].float()
        return self.scale[:, :, lo:hi].float(), offset

    def _span(self, start: int, stop: int) -> tuple[int, int]:
        return start // self.layout.block * self.layout.k, stop // self.layout.block * self.layout.k

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """Dequantized rows of tokens [start, stop): (B, H, n_rows, D) float32, a view of the buffer."""
        r0, r1 = self._span(start, stop)
        spec = self.spec
        if spec is not None and spec.bits == 3:  # codes straddle bytes: the leaf codec decodes them
            return self._out(r1 - r0).copy_(rows(self.layout, self.enc, start, stop))
        out = self._levels(r0, r1)
        if spec is None:
            return out
        b, h, n, d = out.shape
        scale, offset = self._stats(r0, r1)
        if spec.per_channel:  # (B, H, n/g, g, D) * (B, H, n/g, 1, D)
            grouped, scale, offset = out.view(b, h, n // spec.group, spec.group, d), scale.unsqueeze(3), offset
            offset = None if offset is None else offset.unsqueeze(3)
        else:  # (B, H, n, D/g, g) * (B, H, n, D/g, 1)
            grouped, scale = out.view(b, h, n, d // spec.group, spec.group), scale.unsqueeze(4)
            offset = None if offset is None else offset.unsqueeze(4)
        grouped.mul_(scale)
        if offset is not None:
            grouped.add_(offset)
        return out

    def scores(self, q: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """q (B, H, NQ, D) . every row of tokens [start, stop) -> (B, H, NQ, n_rows).

        Per-channel scales and zeros fold into the queries, block by block, so the levels are never rescaled:
        q . (level * s + z) = (q * s) . level + q . z for the `group` rows sharing s and z.
        """
        spec = self.spec
        if spec is None or not spec.per_channel or spec.bits == 3:
            return q @ self.rows(start, stop).transpose(2, 3)
        r0, r1 = self._span(start, stop)
        lv = self._levels(r0, r1)
        b, h, n, d = lv.shape
        scale, offset = self._stats(r0, r1)  # (B, H, n/g, D)
        blocks = lv.view(b, h, n // spec.group, spec.group, d)
        per_block = (q.unsqueeze(2) * scale.unsqueeze(3)) @ blocks.transpose(3, 4)  # (B, H, n/g, NQ, g)
        if offset is not None:  # (B, H, n/g, NQ, g) + (B, H, n/g, NQ, 1)
            per_block += (offset @ q.transpose(2, 3)).unsqueeze(4)
        return per_block.transpose(2, 3).reshape(b, h, q.shape[2], n)

    def to_tokens(self, row_scores: torch.Tensor) -> torch.Tensor:
        """Row-domain scores (..., nblk*k) -> token scores (..., nblk*r)."""
        k, r = self.m.shape
        if k == r == 1:
            return row_scores
        lead = row_scores.shape[:-1]
        return (row_scores.reshape(*lead, -1, k) @ self.m).reshape(*lead, -1)

    def to_rows(self, weights: torch.Tensor) -> torch.Tensor:
        """Token weights (..., nblk*r) -> row weights (..., nblk*k)."""
        k, r = self.m.shape
        if k == r == 1:
            return weights
        lead = weights.shape[:-1]
        return (weights.reshape(*lead, -1, r) @ self.m.T).reshape(*lead, -1)


def _archive_bytes(segments: list[Segment]) -> int:
    total = 0
    for seg in segments:
        if isinstance(seg, Coded):
            total += seg.keys.nbytes + seg.values.nbytes
        else:
            total += seg.keys.numel() * seg.keys.element_size() + seg.values.numel() * seg.values.element_size()
    return total


def decode_attention_torch(
    query: torch.Tensor, segments: list[Segment], scale: float | None = None, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Attention of query (B, Hq, T, D) on the segments: (B, Hq, T, Dv); mask as decode_attention_ref's."""
    b, hq, t, d = query.shape
    hkv, _ = _geometry(segments)
    s_total = sum(seg.tokens for seg in segments)
    budget = max(SCORE_FRACTION * _archive_bytes(segments), MIN_SCORE_BYTES)
    block = max(1, min(t, int(budget // max(1, b * hq * s_total * 4))))
    outs = []
    for lo in range(0, t, block):
        hi = min(t, lo + block)
        part = None if mask is None else mask[:, :, lo:hi] if mask.shape[2] == t else mask
        outs.append(_attend(query[:, :, lo:hi], segments, scale, part, hkv))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def _attend(query, segments, scale, mask, hkv) -> torch.Tensor:
    b, hq, t, d = query.shape
    g = hq // hkv
    dv = segments[0].values.shape[-1]
    device = query.device
    scale = d**-0.5 if scale is None else scale
    q = query.float().reshape(b, hkv, g * t, d)  # query head = kv head * G + g: rows g-major, then t
    v_rot = _value_rotation(segments, dv, device)
    chunk_bytes = min(max(CHUNK_FRACTION * _archive_bytes(segments), MIN_CHUNK_BYTES), MAX_CHUNK_BYTES)
    s_total = sum(seg.tokens for seg in segments)
    scores = torch.empty((b, hkv, g * t, s_total), dtype=torch.float32, device=device)

    spans = []  # (position, segment, tokens per chunk)
    pos = 0
    for seg in segments:
        if isinstance(seg, Raw):
            keys = seg.keys.float()
            scores[..., pos : pos + seg.tokens].copy_(q @ keys.transpose(2, 3))
            spans.append((pos, seg, seg.tokens))
        else:
            kl, vl = layout_of(seg.key_codec), layout_of(seg.value_codec)
            unit = math.lcm(seg.key_codec.block_tokens, seg.value_codec.block_tokens, kl.block, vl.block)
            per_token = b * hkv * 4 * max(d * kl.k / kl.block, dv * vl.k / vl.block)
            step = max(unit, int(chunk_bytes // per_token) // unit * unit)
            step = min(step, -(-seg.tokens // unit) * unit)
            keys = _Rows(seg.key_codec, seg.keys, d, device, step * kl.k // kl.block)
            qk = q if keys.q is None else q @ keys.q
            for lo in range(0, seg.tokens, step):
                hi = min(seg.tokens, lo + step)
                scores[..., pos + lo : pos + hi].copy_(keys.to_tokens(keys.scores(qk, lo, hi)))
            del keys  # its buffers go before the values' are made
            spans.append((pos, seg, step))
        pos += seg.tokens

    scores.mul_(scale)
    if mask is not None:
        scores.view(b, hkv, g, t, s_total).add_(_bias(mask, b, hkv, g, t))
    peak = scores.amax(-1, keepdim=True)
    peak = torch.where(torch.isinf(peak), torch.zeros_like(peak), peak)  # rows that see nothing
    weights = scores.sub_(peak).exp_()  # (B, Hkv, G*T, S), unnormalized
    total = weights.sum(-1, keepdim=True)

    out = torch.zeros((b, hkv, g * t, dv), dtype=torch.float32, device=device)
    for pos, seg, step in spans:
        if isinstance(seg, Raw):
            values = seg.values.float()
            values = values if v_rot is None else values @ v_rot
            out.add_(weights[..., pos : pos + seg.tokens] @ values)
            continue
        vl = layout_of(seg.value_codec)
        values = _Rows(seg.value_codec, seg.values, dv, device, step * vl.k // vl.block)
        for lo in range(0, seg.tokens, step):
            hi = min(seg.tokens, lo + step)
            out.add_(values.to_rows(weights[..., pos + lo : pos + hi]) @ values.rows(lo, hi))
        del values
    out.div_(total)
    if v_rot is not None:
        out = out @ v_rot.T
    return out.reshape(b, hq, t, dv).to(query.dtype)

