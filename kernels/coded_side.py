"""One side (keys or values) of a coded span as decode_attention_torch reads it on the CPU: float32 rows a piece
at a time, or products on the codes by the compiled kernel (kernels/codes_cpu.py).

    side = CodedSide(codec, enc, head_dim, device, query_rows)
    side.scores(side.query(q), start, stop)   # q . rows of tokens [start, stop): (B, H, NQ, n)
    side.output(side.weighted(w, start, stop))  # w @ rows, back in the tokens' domain: (B, H, NQ, D)

How rows are made (decode_attention_torch's docstring, "rows"): 2- and 4-bit integer codes by shifts
into dense byte planes, codebook codes by one gather from a table that unpacks and looks up at once,
8-bit integer codes and raw rows by one cast, then one multiply by the scales; the offsets (zeros) are
folded into the scores and the output instead of the rows. Buffers are reused per thread (SCRATCH).
"""

from __future__ import annotations

import functools
import threading

import torch

from codeckv.codecs.layout import Codec, Encoded, RowLayout

from .codes_cpu import codes_scores, codes_supported, codes_weighted, float8_supported
from .layout import basis, layout_of, levels, rotation, tensors

_CODE_TABLE_INDEX_BITS = {2: 8, 4: 8, 8: 8, 3: 12}  # bits of stored code stream read per table lookup


def cached_layout(codec: Codec):
    """layout_of(codec), built once per codec (codecs are frozen dataclasses; an unhashable one is read each time)."""
    try:
        return _cached_layout(codec)
    except TypeError:
        return layout_of(codec)


@functools.cache
def _cached_layout(codec: Codec):
    return layout_of(codec)


@functools.cache
def _code_table(values: tuple[float, ...], bits: int, device: torch.device) -> torch.Tensor:
    """level[code] of every code in an index of _CODE_TABLE_INDEX_BITS[bits] stream bits, one element each.

    Indexing it with stored bytes (or 12-bit halves of a 3-bit unit) unpacks and dequantizes in one gather:
    1 level per element (float32), 2 (viewed as int64) or 4 (complex128), in stream order.
    """
    index_bits = _CODE_TABLE_INDEX_BITS[bits]
    per_entry = index_bits // bits
    index = torch.arange(1 << index_bits)
    table = torch.tensor(values, dtype=torch.float32)
    entries = torch.stack([table[(index >> (i * bits)) & ((1 << bits) - 1)] for i in range(per_entry)], dim=1)
    view = {1: torch.float32, 2: torch.int64, 4: torch.complex128}[per_entry]
    return entries.contiguous().view(view).view(-1).to(device)


def _planar(spec) -> bool:
    """True for 2- and 4-bit integer codes whose scale groups hold whole planes: unpacked by shifts, no gather."""
    planes = 8 // spec.bits
    return not spec.lloyd_max and spec.bits in (2, 4) and (spec.per_channel or spec.group % planes == 0)


@functools.cache
def _plane_order(head_dim: int, planes: int, device: torch.device) -> torch.Tensor:
    """The channel of each planar column: column p * (D/planes) + i holds channel planes * i + p."""
    return torch.arange(head_dim, device=device).view(-1, planes).T.reshape(-1)


class Scratch(threading.local):
    """Per-thread buffers reused by every call: the rows of one piece and the indices they are gathered with.

    A piece's rows are consumed (one matmul) before the next piece's are made, so one buffer serves every
    piece and both sides; reusing it avoids a fresh allocation (and its page faults) per piece.
    """

    def __init__(self) -> None:
        self.buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}

    def get(self, name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A (numel,) tensor of `dtype` on `device`, grown when needed."""
        key = (name, dtype, device)
        buffer = self.buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            with torch.inference_mode(False):  # a normal tensor: written in place inside inference mode or not
                buffer = self.buffers[key] = torch.empty(numel, dtype=dtype, device=device)
        return buffer[:numel]


SCRATCH = Scratch()


class CodedSide:
    """One side (keys or values) of a coded segment, read as float32 rows a piece at a time, or, for integer or
    codebook codes or 8-bit float rows on the CPU with few query rows, multiplied on its codes by the compiled
    kernel (codes_cpu)."""

    def __init__(self, codec: Codec, enc: Encoded, head_dim: int, device: torch.device, query_rows: int) -> None:
        self.layout: RowLayout = cached_layout(codec)
        self.data, self.scale, self.offset = tensors(self.layout, enc)
        self.spec = spec = self.layout.quant
        self.unit = max(self.layout.block, codec.block_tokens)
        self.m = basis(self.layout, device)  # (k, r)
        self.q = rotation(self.layout, head_dim, device)
        self.table = None  # a gather table, or None: raw rows and 8-bit integer codes are cast
        self.planes = 1  # > 1: integer codes unpacked by shifts into planes (rows in `perm` channel order)
        self.perm = None  # channel of each row column when planar, else None
        self.compiled = (  # the products run on the codes (rows() is never called); channels stay in order
            device.type == "cpu" and self.layout.block == 1 and self.layout.k == 1
            and ((codes_supported(spec, head_dim, query_rows) and self.scale is not None
                  and self.scale.dtype == torch.float16 and (not spec.per_channel or self.unit % spec.group == 0))
                 or (spec is None and float8_supported(self.data.dtype, head_dim, query_rows)))  # FP8 rows at scale 1
        )
        if not self.compiled and spec is not None and _planar(spec):
            self.planes = 8 // spec.bits
            self.perm = _plane_order(head_dim, self.planes, device)
        elif not self.compiled and spec is not None and (spec.bits != 8 or spec.lloyd_max):
            self.table = _code_table(tuple(levels(spec, device).tolist()), spec.bits, device)
        self.out_map = None  # (D, D): planar / rotated value rows -> the tokens' channels
        if self.q is not None:
            self.out_map = self.q.T if self.perm is None else self.q.T[self.perm].contiguous()

    def query(self, q: torch.Tensor) -> torch.Tensor:
        """q (B, H, NQ, D) in the domain of this side's rows: rotated by Q, columns in planar order."""
        q = q if self.q is None else q @ self.q
        return q if self.perm is None else q[..., self.perm]

    def output(self, out: torch.Tensor) -> torch.Tensor:
        """Weighted value rows (B, H, NQ, D) back in the tokens' domain."""
        if self.out_map is not None:
            return out @ self.out_map
        return out if self.perm is None else out.index_copy(-1, self.perm, out)

    def rows_per_token(self) -> float:
        """float32 rows a piece materializes per token (none on the compiled path)."""
        return 0.0 if self.compiled else self.layout.k / self.layout.block

    def _codes(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Codes, float16 scales and offsets (or None) of tokens [start, stop) (start: a multiple of a group);
        rows of 8-bit floats alone (no spec)."""
        if self.spec is None:
            return self.data[:, :, start:stop], None, None
        group = self.spec.group
        span = slice(start // group, -(-stop // group)) if self.spec.per_channel else slice(start, stop)
        offset = None if self.offset is None else self.offset[:, :, span]
        return self.data[:, :, start:stop], self.scale[:, :, span], offset

    def stored(self) -> tuple:
        """(codes, scale, offset or None, spec) of every token, as codes_decode takes them (compiled sides)."""
        return (*self._codes(0, self.data.shape[2]), self.spec)

    def scores(self, q: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """q (B, H, NQ, D) . the rows of tokens [start, stop): (B, H, NQ, n)."""
        if self.compiled:
            codes, scale, offset = self._codes(start, stop)
            return codes_scores(q, codes, scale, self.spec, offset)
        row_scores = q @ self.rows(start, stop).transpose(2, 3)
        self.add_score_offsets(row_scores, q, start, stop)
        return row_scores

    def weighted(self, row_weights: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """row_weights (B, H, NQ, n) @ the rows of tokens [start, stop): (B, H, NQ, D)."""
        if self.compiled:
            codes, scale, offset = self._codes(start, stop)
            return codes_weighted(row_weights, codes, scale, self.spec, offset)
        out = row_weights @ self.rows(start, stop)
        self.add_output_offsets(out, row_weights, start, stop)
        return out

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows of tokens [start, stop) (whole units), scaled but without their offsets: (B, H, n_rows, D) float32."""
        k, r = self.layout.k, self.layout.block
        r0, r1 = start // r * k, stop // r * k
        stored = self.data[:, :, r0:r1]
        spec = self.spec
        b, h, n, m = stored.shape
        d = m if self.table is None and self.planes == 1 else m * 8 // spec.bits
        out = SCRATCH.get("rows", b * h * n * d, torch.float32, stored.device).view(b, h, n, d)
        if self.planes > 1:
            self._unpack(stored, out)
        elif self.table is None:
            out.copy_(stored)  # raw rows (any float dtype) or 8-bit integer codes
        else:
            self._gather(stored, out)
        if spec is None:
            return out
        if spec.per_channel:  # rows (B, H, n/g, g, D) with scales (B, H, n/g, 1, D)
            scale = self.scale[:, :, r0 // spec.group : r1 // spec.group]
            if self.planes > 1:  # column (plane p, byte i) is channel planes*i + p: (.., planes, D/planes)
                scale = scale.unflatten(-1, (-1, self.planes)).transpose(-1, -2)
            grouped = out.view(b, h, n // spec.group, spec.group, *scale.shape[3:])
            scale = scale.unsqueeze(3)
        elif self.planes > 1:  # rows (B, H, n, planes, D/g, g/planes) with scales (B, H, n, 1, D/g, 1)
            grouped = out.view(b, h, n, self.planes, d // spec.group, spec.group // self.planes)
            scale = self.scale[:, :, r0:r1].unsqueeze(3).unsqueeze(5)
        else:  # rows (B, H, n, D/g, g) with scales (B, H, n, D/g, 1)
            grouped = out.view(b, h, n, d // spec.group, spec.group)
            scale = self.scale[:, :, r0:r1].unsqueeze(4)
        grouped.mul_(scale.to(torch.float32, memory_format=torch.contiguous_format))  # small; dense keeps it vectorized
        return out

    def offsets(self, start: int, stop: int) -> tuple[torch.Tensor, bool] | None:
        """The offsets of the rows of tokens [start, stop) as float32, and whether they are per channel; None if none.

        rows() leaves them out: added to every row they would cost a pass over the rows, while folded into
        the scores (score_offsets) or the output (output_offsets) they touch only the few query rows.
        Per channel: (B, H, n_rows / group, D) in row-column order; per token: (B, H, n_rows, D / group).
        """
        if self.offset is None:
            return None
        k, r = self.layout.k, self.layout.block
        r0, r1 = start // r * k, stop // r * k
        if self.spec.per_channel:
            offset = self.offset[:, :, r0 // self.spec.group : r1 // self.spec.group].float()
            return (offset if self.perm is None else offset[..., self.perm]), True
        return self.offset[:, :, r0:r1].float(), False

    def _group_sums(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., D) in row-column order summed over each group of channels: (..., D / group)."""
        if self.planes > 1:  # column (plane p, byte i) is channel planes*i + p
            return x.unflatten(-1, (self.planes, -1, self.spec.group // self.planes)).sum((-3, -1))
        return x.unflatten(-1, (-1, self.spec.group)).sum(-1)

    def _group_spread(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., D / group) repeated to every channel of its group, in row-column order: (..., D)."""
        g = self.spec.group
        if self.planes > 1:
            return x[..., None, :, None].expand(*x.shape[:-1], self.planes, x.shape[-1], g // self.planes).flatten(-3)
        return x.repeat_interleave(g, dim=-1)

    def add_score_offsets(self, row_scores: torch.Tensor, q: torch.Tensor, start: int, stop: int) -> None:
        """Add to row_scores (B, H, NQ, n_rows) the part of q . row that the offsets make (q in row-column order)."""
        found = self.offsets(start, stop)
        if found is None:
            return
        offset, per_channel = found
        if per_channel:  # every row of a group shares its offsets: q . offset once per group
            bias = q @ offset.transpose(2, 3)  # (B, H, NQ, n_rows / group)
            row_scores.unflatten(-1, (-1, self.spec.group)).add_(bias.unsqueeze(-1))
        else:  # an offset per group of a row's channels: (sum of q over the group) . offset
            row_scores.add_(self._group_sums(q) @ offset.transpose(2, 3))

    def add_output_offsets(self, out: torch.Tensor, row_weights: torch.Tensor, start: int, stop: int) -> None:
        """Add to out (B, H, NQ, D) the part of row_weights @ rows that the offsets make."""
        found = self.offsets(start, stop)
        if found is None:
            return
        offset, per_channel = found
        if per_channel:  # the weights of a group's rows summed, times the group's offsets
            out.add_(row_weights.unflatten(-1, (-1, self.spec.group)).sum(-1) @ offset)
        else:
            out.add_(self._group_spread(row_weights @ offset))

    def _unpack(self, stored: torch.Tensor, out: torch.Tensor) -> None:
        """Integer codes (B, H, n, bytes) into out (B, H, n, D) float32 as planes: code p of every byte, p-major.

        Each plane is shifted and masked into its own dense uint8 buffer (byte ops vectorize only on dense
        outputs), the planes are concatenated along the row, then cast to float32 in one dense copy.
        """
        b, h, n, m = stored.shape
        bits, mask = self.spec.bits, (1 << self.spec.bits) - 1
        planes = SCRATCH.get("planes", self.planes * stored.numel(), torch.uint8, stored.device)
        planes = planes.view(self.planes, b, h, n, m)
        for p in range(self.planes):
            if p == 0:
                torch.bitwise_and(stored, mask, out=planes[0])
            else:
                torch.bitwise_right_shift(stored, p * bits, out=planes[p])
                if p < self.planes - 1:
                    planes[p].bitwise_and_(mask)
        rows = SCRATCH.get("codes", out.numel(), torch.uint8, stored.device).view(b, h, n, self.planes * m)
        torch.cat(list(planes), dim=-1, out=rows)
        out.copy_(rows)

    def _gather(self, stored: torch.Tensor, out: torch.Tensor) -> None:
        """level[code] of stored codes (B, H, n, bytes) into out (B, H, n, D) float32: one gather."""
        b, h, n, m = stored.shape
        if self.spec.bits == 3:  # 3 bytes hold 8 codes: look their 24-bit word up as two 12-bit halves
            units = stored.reshape(b, h, n, m // 3, 3).to(torch.int32)
            word = units[..., 0] | (units[..., 1] << 8) | (units[..., 2] << 16)
            index = torch.stack([word & 0xFFF, word >> 12], dim=-1).view(-1)
        else:
            index = SCRATCH.get("index", stored.numel(), torch.int32, stored.device)
            index.view(stored.shape).copy_(stored)
        torch.index_select(self.table, 0, index, out=out.view(self.table.dtype).view(-1))

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
