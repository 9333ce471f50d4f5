"""decode_attention_torch: attention on stored codes for the CPU, in few large torch ops and bounded memory.

Same math as the reference in decode_attention.py (scores and weighted values in the row domain of each
codec: q . x = (q Q) . row weighted by M, sum_p w[p] x[p] = ((w M.T) . rows) Q.T), organised for speed:
a decode step on a few thousand tokens is a dozen large ops, so the Python overhead of a call stays near
that of SDPA.

    pieces   every segment cut into pieces of at most ROWS_BYTES of float32 rows per side (a raw span,
             or a chunk of archived blocks; one piece per segment for a decode step up to ~5k tokens
             at 3 KV heads x 64)
    rows     codes -> float32 rows (kernels/coded_side.py): 2- and 4-bit integer codes by shifts into
             dense byte planes (code p of every byte, p-major: the rows' columns are a fixed channel
             permutation, undone on the queries and the output, never on the rows) and one cast;
             codebook (Lloyd-Max) codes by one gather from a table that unpacks and looks up at once (a
             byte -> 1, 2 or 4 levels; 3-bit codes: 12-bit halves of each 3-byte unit -> 4 levels each);
             8-bit integer codes and raw rows by one cast; then one multiply by the scales of their
             groups, in float32. The offsets (zeros) never touch the rows: folded into the scores
             (q . offset once per group) and the output (the weights summed per group, times the
             offsets), they cost a pass over queries only
    passes   consecutive pieces whose scores fit SCORE_BYTES form a pass: their scores (queries
             pre-scaled) go into one (B, Hkv, G*T, n) buffer, softmax'd (the mask added where it hides
             a token of the pass) and applied to the values piece by piece; passes merge with an online
             softmax (only long prefills need several)
    compiled on the CPU, a side whose codes kernels/codes_cpu.c reads (no DCT; at most codes_cpu.MAX_ROWS
             query rows per KV head: a decode step, not a long prefill chunk) never makes rows: the kernel
             makes its products on the codes; a decode step with one coded span and no hidden token is
             one call of it for the whole attention (_whole_step)

The extra memory of a call is bounded by ROWS_BYTES and SCORE_BYTES, whatever the context. Handles any
T, GQA, masks (rows that see nothing in a pass, as causal prefill chunks have), raw segments anywhere,
different key and value layouts; a codec without a row layout (png) is the reference's job
(`decode_attention_torch_supported`).
"""

from __future__ import annotations

import math

import torch

from codeckv.codecs.layout import RowLayout

from .coded_side import CodedSide, cached_layout
from .codes_cpu import MAX_RAW, MAX_ROWS, codes_decode
from .decode_attention import _bias
from .segments import Coded, Raw, Segment, geometry

ROWS_BYTES = 4 << 20  # float32 rows of one piece and side (keys or values), at most
SCORE_BYTES = 4 << 20  # float32 scores of one pass (every query row against the pass's tokens), at most


def decode_attention_torch_supported(segments: list[Segment]) -> bool:
    """True when every coded span's key and value codecs declare a row layout."""
    return all(
        isinstance(cached_layout(codec), RowLayout)
        for seg in segments if isinstance(seg, Coded) for codec in (seg.key_codec, seg.value_codec)
    )


def decode_attention_torch_compiled(segment: Coded, head_dim: int, query_rows: int = 1) -> tuple[bool, bool]:
    """Whether the compiled CPU kernel (codes_cpu) multiplies (keys, values) of `segment` on their codes."""
    device = next(iter(segment.keys.data.values())).device
    return tuple(
        CodedSide(codec, enc, head_dim, device, query_rows).compiled
        for codec, enc in ((segment.key_codec, segment.keys), (segment.value_codec, segment.values))
    )


class _RawPiece:
    """Tokens [start, stop) of a raw segment."""

    def __init__(self, seg: Raw, start: int, stop: int) -> None:
        self.keys, self.values = seg.keys[:, :, start:stop], seg.values[:, :, start:stop]
        self.tokens = stop - start

    def scores(self, q: torch.Tensor) -> torch.Tensor:
        """q (B, H, NQ, D) . every key -> (B, H, NQ, n)."""
        return q @ self.keys.float().transpose(2, 3)

    def weighted(self, weights: torch.Tensor) -> torch.Tensor:
        """weights (B, H, NQ, n) @ values -> (B, H, NQ, Dv)."""
        return weights @ self.values.float()


class _CodedPiece:
    """Tokens [start, stop) (whole units) of a coded segment; `q` is the segment's query in the key domain."""

    def __init__(self, keys: CodedSide, values: CodedSide, q: torch.Tensor, start: int, stop: int) -> None:
        self.keys, self.values, self.q = keys, values, q
        self.start, self.stop = start, stop
        self.tokens = stop - start

    def scores(self, q: torch.Tensor) -> torch.Tensor:
        return self.keys.to_tokens(self.keys.scores(self.q, self.start, self.stop))

    def weighted(self, weights: torch.Tensor) -> torch.Tensor:
        row_weights = self.values.to_rows(weights)
        return self.values.output(self.values.weighted(row_weights, self.start, self.stop))


def _pieces(segments: list[Segment], q: torch.Tensor, max_tokens: int, head_dims: tuple[int, int]):
    """Every segment as pieces of at most ROWS_BYTES of rows per side and `max_tokens` tokens, in order."""
    b, h, _, _ = q.shape
    d, dv = head_dims
    for seg in segments:
        if isinstance(seg, Raw):
            step = max(1, min(max_tokens, ROWS_BYTES // (b * h * 4 * max(d, dv))))
            for lo in range(0, seg.tokens, step):
                yield _RawPiece(seg, lo, min(seg.tokens, lo + step))
            continue
        keys = CodedSide(seg.key_codec, seg.keys, d, q.device, q.shape[2])
        values = CodedSide(seg.value_codec, seg.values, dv, q.device, q.shape[2])
        unit = math.lcm(seg.key_codec.block_tokens, seg.value_codec.block_tokens, keys.unit, values.unit)
        per_token = b * h * 4 * max(d * keys.rows_per_token(), dv * values.rows_per_token(), 1)
        step = max(unit, int(min(max_tokens, ROWS_BYTES // per_token)) // unit * unit)
        qk = keys.query(q)
        for lo in range(0, seg.tokens, step):
            yield _CodedPiece(keys, values, qk, lo, min(seg.tokens, lo + step))


def _passes(pieces, max_tokens: int):
    """Consecutive pieces grouped into passes of at most `max_tokens` tokens (a longer piece alone)."""
    group, tokens = [], 0
    for piece in pieces:
        if group and tokens + piece.tokens > max_tokens:
            yield group
            group, tokens = [], 0
        group.append(piece)
        tokens += piece.tokens
    if group:
        yield group


def _masks_any(mask: torch.Tensor, pos: int, n: int) -> bool:
    """True when the mask hides any of tokens [pos, pos + n) from any query (a prefill chunk sees all the archive)."""
    part = mask[..., pos : pos + n]
    return not bool(part.all()) if part.dtype == torch.bool else bool((part != 0).any())


def _whole_step(q: torch.Tensor, segments: list[Segment], mask: torch.Tensor | None) -> torch.Tensor | None:
    """The whole attention in one call of the compiled kernel (codes_decode), where it applies: one coded span
    whose both sides it reads, at most codes_cpu.MAX_RAW raw spans, a mask that hides nothing, keys and
    values of one head_dim. Else None (the pieces and passes below). q (B, Hkv, R, D) scaled."""
    coded = [seg for seg in segments if isinstance(seg, Coded)]
    if len(coded) != 1 or len(segments) - 1 > MAX_RAW or q.device.type != "cpu" or q.shape[2] > MAX_ROWS:
        return None  # (a prefill chunk's rows: the pieces below, without building its sides twice)
    if mask is not None and _masks_any(mask, 0, sum(seg.tokens for seg in segments)):
        return None
    seg = coded[0]
    d = q.shape[-1]
    keys = CodedSide(seg.key_codec, seg.keys, d, q.device, q.shape[2])
    values = CodedSide(seg.value_codec, seg.values, d, q.device, q.shape[2])
    if not (keys.compiled and values.compiled) or seg.values.shape[-1] != d:
        return None
    raw = [(s.keys, s.values) for s in segments if isinstance(s, Raw)]
    return codes_decode(keys.query(q), q, keys.stored(), values.stored(), raw, values.out_map)


def decode_attention_torch(
    query: torch.Tensor, segments: list[Segment], scale: float | None = None, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Attention of query (B, Hq, T, D) on the segments: (B, Hq, T, Dv); mask as decode_attention_ref's."""
    b, hq, t, d = query.shape
    hkv, dv = geometry(segments)
    g = hq // hkv
    scale = d**-0.5 if scale is None else scale
    q = (query.float() * scale).reshape(b, hkv, g * t, d)  # query head = kv head * G + g: rows g-major, then t
    whole = _whole_step(q, segments, mask)
    if whole is not None:
        return whole.reshape(b, hq, t, dv).to(query.dtype)
    max_tokens = max(1, SCORE_BYTES // (b * hkv * g * t * 4))
    out = total = peak = None
    pos = 0
    for group in _passes(_pieces(segments, q, max_tokens, (d, dv)), max_tokens):
        parts = [piece.scores(q) for piece in group]
        scores = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)  # (B, Hkv, G*T, n)
        n = scores.shape[-1]
        masked = mask is not None and _masks_any(mask, pos, n)
        if masked:  # the bias of this pass's tokens only: a prefill chunk's (T, S) bias never exists whole
            scores.view(b, hkv, g, t, n).add_(_bias(mask[..., pos : pos + n], b, hkv, g, t))
        m = scores.amax(-1, keepdim=True)
        m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m) if masked else m  # rows seeing nothing
        weights = scores.sub_(m_safe).exp_()  # unnormalized
        part_total = weights.sum(-1, keepdim=True)
        at = 0
        part = None
        for piece in group:
            contribution = piece.weighted(weights[..., at : at + piece.tokens])
            part = contribution if part is None else part.add_(contribution)
            at += piece.tokens
        pos += n
        if out is None:
            out, total, peak = part, part_total, m
            continue
        new_peak = torch.maximum(peak, m)
        new_safe = torch.where(torch.isinf(new_peak), torch.zeros_like(new_peak), new_peak)
        alpha, beta = torch.exp(peak - new_safe), torch.exp(m_safe - new_safe)
        out = out.mul_(alpha).add_(part.mul_(beta))
        total = total.mul_(alpha).add_(part_total.mul_(beta))
        peak = new_peak
    out = out.div_(total)
    return out.reshape(b, hq, t, dv).to(query.dtype)
