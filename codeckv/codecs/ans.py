"""Entropy coding of integer codes with static, calibrated tables: one rANS stream per archived chunk.

    table = EntropyTable.fit(calibration_codes)        # (N, r) int codes -> one categorical model per column
    table = EntropyTable.from_counts(counts, classes)  # or models shared by classes of columns (codecs/pca.py)
    stream = table.encode(codes, shift)                # (m, r) int codes -> bytes (what the archive holds)
    streams = table.encode_many([codes, ...], shifts)  # many chunks at once: the same bytes, vectorized
    per_table = encode_tables([(table, [codes, ...], shifts), ...])  # many tables' chunks in one pass
    codes = table.decode(stream, m, shift)             # the exact (m, r) codes back
    codes = table.decode_many(streams, [m, ...], shifts)

A table holds K categorical models and the class of each of its r columns: column i of a stream coded
with shift s uses model classes[i] - s (the PCA coder's quantizer ladder: a step 2^(1/4) coarser moves
every column one class down, codecs/pca.py). Model k codes symbols q + M_k for q in [-M_k, M_k] (M_k: a
high quantile of |q| on calibration) and one escape symbol for anything outside, followed by the value
itself in 16 bits. The coder is `constriction`'s stack-based ANS (Duda 2013): within a few bytes of the
ideal code length -log2 p(codes) per chunk. The tables are calibration constants, stored with the basis.

A stream holds its symbols class by class (stable within a class: row by row, column by column), so the
constriction path codes each class's run with one fixed model, and the order does not depend on the shift.
encode_many and encode_tables (many tables) run the compiled coder where it is built (kernels/ans_cpu.c, one
call per table and row count), else the coder's arithmetic in numpy across streams (codecs/ans_vectorized.py);
decode_many runs the numpy one. Every path writes byte for byte what constriction writes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import constriction
import numpy as np
import torch

from codeckv.codecs.ans_vectorized import (
    DECODE_VECTORIZED,
    ESCAPE_RANGE,
    PRECISION,
    Prepared,
    decode_streams,
    encode_tables_numpy,
)
from codeckv.kernel_package import kernel_module

LENGTH_BYTES = 4  # every stored stream carries its length (counted in nbytes)
STREAM_SLACK_BYTES = 8  # a stream is at most this much longer than ceil(ideal bits / 8): its final 64-bit state
_ESCAPED = constriction.stream.model.Uniform(ESCAPE_RANGE)


def encode_tables(jobs: list[tuple[EntropyTable, list[torch.Tensor], list[int]]]) -> list[list[bytes]]:
    """Per job (table, chunks, shifts), one stream per chunk: table.encode(chunk, shift)'s bytes, for many tables
    at once: the compiled coder where it is built, else numpy's passes over all of them (module docstring)."""
    if kernel_module("ans_cpu").ans_available():
        return [table._encode_compiled(chunks, shifts) for table, chunks, shifts in jobs]
    return encode_tables_numpy(jobs)


@dataclass
class _Order:
    """The class-major order of the m x r symbols of a stream: positions, their base classes, class runs."""

    order: np.ndarray  # (L,) flat position (row * r + column) of the t-th symbol
    classes: np.ndarray  # (L,) int64 base class of the t-th symbol
    runs: list[tuple[int, int, int]]  # (base class, first, end) of each run of equal class


@dataclass
class EntropyTable:
    """K categorical models, probs (K, n) and offset (K,) = M_k, and classes (r,): each column's model at shift 0."""

    probs: torch.Tensor  # (K, n) float32, rows sum to 1, zero past each row's escape symbol
    offset: torch.Tensor  # (K,) int64
    classes: torch.Tensor  # (r,) int64
    _orders: dict = field(default_factory=dict, repr=False, compare=False)  # rows -> _Order
    _fixed: tuple | None = field(default=None, repr=False, compare=False)  # (cumulative, frequency) (K, n) uint64
    _fixed_flat: tuple | None = field(default=None, repr=False, compare=False)  # the same, flat uint32
    _models: dict = field(default_factory=dict, repr=False, compare=False)  # class -> constriction model

    @classmethod
    def fit(cls, codes: torch.Tensor, coverage: float = 0.9999, max_abs: int = 255, alpha: float = 0.5) -> EntropyTable:
        """Histogram (N, r) calibration codes into one model per column (class i = column i)."""
        codes = codes.long()
        r = codes.shape[1]
        index = (codes.clamp(-max_abs - 1, max_abs + 1) + max_abs + 1) + torch.arange(r) * (2 * max_abs + 3)
        counts = torch.bincount(index.reshape(-1), minlength=r * (2 * max_abs + 3)).view(r, -1)
        return cls.from_counts(counts, torch.arange(r), coverage, alpha)

    @classmethod
    def from_counts(cls, counts: torch.Tensor, classes: torch.Tensor, coverage: float = 0.9999,
                    alpha: float = 0.5) -> EntropyTable:
        """Models from (K, 2 A + 3) histograms of q in [-A - 1, A + 1] (the ends: |q| > A), and each column's class.

        M_k = the `coverage` quantile of |q| in class k (1..A); add-alpha smoothing, so a code never seen in
        calibration still costs finitely many bits.
        """
        counts = counts.double()
        k, width = counts.shape
        limit = (width - 3) // 2
        centre = limit + 1
        magnitude = counts[:, centre:].clone()  # (K, A + 2): |q| = 0 .. A + 1
        magnitude[:, 1:] += counts[:, :centre].flip(1)
        share = magnitude.cumsum(1) / magnitude.sum(1, keepdim=True).clamp_min(1)
        m = ((share < coverage).sum(1)).clamp(1, limit)  # (K,) the smallest M covering `coverage`
        n = int(2 * m.max() + 2)
        q = torch.arange(n)[None, :] - m[:, None]  # (K, n): the code of each symbol (2M + 1: the escape)
        inside = q <= m[:, None]
        seen = counts.gather(1, (q.clamp(-limit - 1, limit + 1) + centre).clamp(0, width - 1)) * inside
        escape = counts.sum(1) - seen.sum(1)
        probs = torch.where(inside, seen + alpha, torch.zeros(()))
        probs[torch.arange(k), 2 * m + 1] = escape + alpha
        return cls((probs / probs.sum(1, keepdim=True)).float(), m, classes.long())

    @property
    def columns(self) -> int:
        return self.classes.numel()

    def __deepcopy__(self, memo: dict) -> EntropyTable:
        """A copy of the tables, without what is memoized (constriction's models cannot be copied; rebuilt lazily)."""
        return EntropyTable(*(copy.deepcopy(t, memo) for t in (self.probs, self.offset, self.classes)))

    def _check(self, shift: int) -> None:
        """Raise ValueError unless every column has a model at this shift."""
        low, high = int(self.classes.min()) - shift, int(self.classes.max()) - shift
        if low < 0 or high >= self.probs.shape[0]:
            raise ValueError(f"shift {shift} takes columns to classes {low}..{high} "
                             f"(allowed: 0..{self.probs.shape[0] - 1})")

    def symbols(self, codes: torch.Tensor, shift: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(..., r) codes -> their (..., r) classes at `shift` and symbols (2 M + 1 = escape)."""
        classes = (self.classes - shift).expand_as(codes)
        m = self.offset[classes]
        codes = codes.long()
        return classes, torch.where(codes.abs() <= m, codes + m, 2 * m + 1)

    def bits(self, codes: torch.Tensor, shift: int = 0) -> torch.Tensor:
        """Ideal code length in bits of each column of (m, r) codes under this table, escapes included -> (r,)."""
        classes, symbols = self.symbols(codes, shift)
        p = self.probs.double()[classes, symbols]
        escape = (codes.long().abs() > self.offset[classes]).double() * np.log2(ESCAPE_RANGE)
        return (-torch.log2(p) + escape).sum(0)

    def code_bits(self, limit: int = 255) -> torch.Tensor:
        """(K, 2 limit + 3) float32: the bits the coder spends on each code q in [-limit - 1, limit + 1] under each
        model, from its fixed-point frequencies (an escape: the escape symbol + 16 bits; |q| > limit: escaped)."""
        _, frequency = self._fixed_point()
        cost = torch.from_numpy(PRECISION - np.log2(np.maximum(frequency, 1).astype(np.float64)))  # (K, n)
        q = torch.arange(-limit - 1, limit + 2)[None, :]
        m = self.offset[:, None]
        symbols = torch.where(q.abs() <= m, q + m, 2 * m + 1)
        return (cost.gather(1, symbols) + (q.abs() > m) * np.log2(ESCAPE_RANGE)).float()

    def _order(self, rows: int) -> _Order:
        """The class-major symbol order of a stream of `rows` code rows (memoized by rows; shift-free)."""
        if rows not in self._orders:
            base = np.tile(self.classes.numpy(), rows)
            order = np.argsort(base, kind="stable")
            classes = base[order]
            bounds = np.flatnonzero(np.diff(classes)) + 1
            starts, ends = np.concatenate([[0], bounds]), np.concatenate([bounds, [classes.size]])
            runs = [(int(classes[a]), int(a), int(b)) for a, b in zip(starts, ends)]
            self._orders[rows] = _Order(order, classes, runs)
        return self._orders[rows]

    def _model(self, k: int):
        """Constriction's categorical model of class k (memoized)."""
        if k not in self._models:
            self._models[k] = constriction.stream.model.Categorical(self.probs[k].numpy(), perfect=False)
        return self._models[k]

    def encode(self, codes: torch.Tensor, shift: int = 0) -> bytes:
        """(m, r) integer codes -> one ANS stream (column i coded with model classes[i] - shift)."""
        self._check(shift)
        order = self._order(codes.shape[0])
        flat = codes.reshape(-1).long().numpy()[order.order]
        offset = self.offset.numpy()[order.classes - shift]
        outside = np.abs(flat) > offset
        symbols = np.where(outside, 2 * offset + 1, flat + offset).astype(np.int32)
        coder = constriction.stream.stack.AnsCoder()
        escaped = np.clip(flat[outside] + ESCAPE_RANGE // 2, 0, ESCAPE_RANGE - 1).astype(np.int32)
        if escaped.size:
            coder.encode_reverse(escaped, _ESCAPED)  # decoded after the symbols (a stack)
        for k, first, end in reversed(order.runs):  # the last run first: decoding reads the first run first
            coder.encode_reverse(symbols[first:end], self._model(k - shift))
        return coder.get_compressed().tobytes()

    def encode_many(self, chunks: list[torch.Tensor], shifts: list[int] | None = None) -> list[bytes]:
        """Many (m_i, r) integer code arrays -> one ANS stream each, byte for byte what encode() writes for each."""
        return encode_tables([(self, chunks, [0] * len(chunks) if shifts is None else shifts)])[0]

    def _encode_compiled(self, chunks: list[torch.Tensor], shifts: list[int]) -> list[bytes]:
        """encode_many on the compiled coder (kernels/ans_cpu.c): one call per row count."""
        ans_encode = kernel_module("ans_cpu").ans_encode
        by_rows: dict[int, list[int]] = {}
        for i, codes in enumerate(chunks):
            by_rows.setdefault(codes.shape[0], []).append(i)
        low, frequency = (table.reshape(self.probs.shape) for table in self._fixed_point_flat())
        offset = self.offset.numpy()
        out: list[bytes] = [b""] * len(chunks)
        for rows, members in by_rows.items():
            for shift in {shifts[i] for i in members}:
                self._check(shift)
            order = self._order(rows)
            codes = torch.stack([chunks[i] for i in members]).reshape(len(members), -1).int().numpy()
            streams = ans_encode(codes, order.order, order.classes, np.array([shifts[i] for i in members]), offset,
                                 low, frequency)
            for i, stream in zip(members, streams):
                out[i] = stream
        return out

    def _fixed_point(self) -> tuple[np.ndarray, np.ndarray]:
        """Per model and symbol, the (K, n) uint64 cumulative and frequency constriction's model gives them."""
        if self._fixed is None:
            p = self.probs.numpy()
            n = p.shape[1]
            right = np.cumsum(p, axis=1, dtype=np.float32)  # sequential float32 sums, as constriction's
            left = np.concatenate([np.zeros_like(right[:, :1]), right[:, :-1]], axis=1)
            scale = np.float32((1 << PRECISION) - n) / right[:, -1:]
            symbol = np.arange(n, dtype=np.uint64)
            low = (left * scale).astype(np.uint32).astype(np.uint64) + symbol
            high = (right * scale).astype(np.uint32).astype(np.uint64) + symbol + np.uint64(1)
            high[:, -1] = 1 << PRECISION  # the last symbol closes the range exactly
            self._fixed = (low, high - low)
        return self._fixed

    def _prepared(self, codes: np.ndarray, rows: int, shift: np.ndarray) -> Prepared:
        """(S, m * r) int32 codes of `rows` rows each, one stream per row at its shift -> what the coder pushes."""
        order = self._order(rows)
        codes = codes[:, order.order]  # class-major
        classes = order.classes.astype(np.int32)[None, :] - shift.astype(np.int32)[:, None]  # (S, L)
        offset = self.offset.numpy().astype(np.int32).take(classes)
        outside = np.abs(codes) > offset
        # each symbol's place in the (K, n) tables, flat: class * n + symbol (2 M + 1: the escape)
        place = np.where(outside, 2 * offset + 1, codes + offset)
        place += classes * np.int32(self.probs.shape[1])
        cumulative, frequency = (table.take(place) for table in self._fixed_point_flat())
        streams, places = np.nonzero(outside)
        escaped = np.clip(codes[streams, places].astype(np.int64) + ESCAPE_RANGE // 2, 0,
                          ESCAPE_RANGE - 1).astype(np.uint64)
        return Prepared(cumulative, frequency, streams, escaped)

    def _fixed_point_flat(self) -> tuple[np.ndarray, np.ndarray]:
        """_fixed_point's tables, flat and as uint32 (every value is below 2^PRECISION), for _prepared."""
        if self._fixed_flat is None:
            self._fixed_flat = tuple(table.ravel().astype(np.uint32) for table in self._fixed_point())
        return self._fixed_flat

    def decode(self, stream: bytes, rows: int, shift: int = 0) -> torch.Tensor:
        """Inverse of encode: one ANS stream -> (rows, r) int32 codes."""
        self._check(shift)
        order = self._order(rows)
        coder = constriction.stream.stack.AnsCoder(np.frombuffer(stream, dtype=np.uint32).copy())
        symbols = np.empty(order.order.size, dtype=np.int64)
        for k, first, end in order.runs:
            symbols[first:end] = coder.decode(self._model(k - shift), end - first)
        offset = self.offset.numpy()[order.classes - shift]
        outside = symbols == 2 * offset + 1
        codes = symbols - offset
        if outside.any():
            codes[outside] = coder.decode(_ESCAPED, int(outside.sum())).astype(np.int64) - ESCAPE_RANGE // 2
        flat = np.empty_like(codes)
        flat[order.order] = codes
        return torch.from_numpy(flat.astype(np.int32)).view(rows, self.columns)

    def decode_many(self, streams: list[bytes], rows: list[int], shifts: list[int] | None = None) -> list[torch.Tensor]:
        """Inverse of encode_many: streams of rows[i] code rows each -> (rows[i], r) int32 codes, as decode() gives."""
        shifts = [0] * len(streams) if shifts is None else shifts
        codes: list[torch.Tensor | None] = [None] * len(streams)
        by_rows: dict[int, list[int]] = {}
        for i, count in enumerate(rows):
            by_rows.setdefault(count, []).append(i)
        for count, members in by_rows.items():
            if len(members) < DECODE_VECTORIZED:
                for i in members:
                    codes[i] = self.decode(streams[i], count, shifts[i])
                continue
            for shift in {shifts[i] for i in members}:
                self._check(shift)
            shift = np.array([shifts[i] for i in members], dtype=np.int64)
            decoded = decode_streams(self, [streams[i] for i in members], count, shift)
            for i, part in zip(members, decoded):
                codes[i] = part.view(count, self.columns)
        return codes

    def state(self) -> dict[str, torch.Tensor]:
        """The tensors to save (torch.save with weights_only loading)."""
        return {"probs": self.probs, "offset": self.offset, "classes": self.classes}

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> EntropyTable:
        return cls(state["probs"], state["offset"], state["classes"])


