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
encode_many writes the very bytes constriction writes, with the coder's arithmetic in numpy across
streams instead of one call per stream: the symbols' fixed-point cumulatives and frequencies are those of
constriction's categorical model (`perfect=False`: float32 prefix sums scaled to 2^24 - n, plus one
count per symbol), computed once per table, and each step of the rANS stack coder (32-bit words, 64-bit
state) runs over every stream at once, each stream with its own shift. A chunk of 8 tokens of smollm2-135m
holds 8 x 212-384 symbols, so a long prompt's hundreds of chunks per layer cost some 3,000 numpy steps
instead of hundreds of constriction calls. Streams stay independent: each still decodes on its own.
decode_many is the same in reverse (the symbol of a quantile: a binary search in the model's cumulatives).
A numpy step costs about as much for 512 streams as for 64, so encode_tables runs the streams of several
tables (a flush of many layers, each with its own table) side by side: streams of different lengths end
together (the coder starts from each stream's last symbol), and each stream still gets exactly its bytes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import constriction
import numpy as np
import torch

ESCAPE_RANGE = 1 << 16  # escaped values are stored in 16 bits (clipped to +-32767)
LENGTH_BYTES = 4  # every stored stream carries its length (counted in nbytes)
PRECISION = 24  # constriction's default ANS coder: 24-bit probabilities, 32-bit words, 64-bit state
WORD_BITS = 32
ESCAPE_FREQUENCY = (1 << PRECISION) // ESCAPE_RANGE  # the Uniform(ESCAPE_RANGE) model: every value 2^24 / 2^16
STREAM_SLACK_BYTES = 8  # a stream is at most this much longer than ceil(ideal bits / 8): its final 64-bit state
# From how many streams on encode_tables (all its chunks) and decode_many (streams of one length) take the
# numpy coder: one numpy step per symbol costs about as much for 16 streams as for 128, so few streams go
# through constriction. Measured on chunks of smollm2-135m (354 components): encoding 64 chunks took 0.60 s
# with constriction and 0.50 s in numpy, 128 chunks 1.36 s and 0.58 s; decoding 128 chunks 0.78 s and 1.23 s
# (a loaded 2-core CPU).
ENCODE_VECTORIZED = 48
ENCODE_BATCH_SYMBOLS = 1 << 23  # symbols one numpy pass codes at most (its uint32 tables: 64 MiB)
DECODE_VECTORIZED = 160
_ESCAPED = constriction.stream.model.Uniform(ESCAPE_RANGE)


@dataclass
class _Order:
    """The class-major order of the m x r symbols of a stream: positions, their base classes, class runs."""

    order: np.ndarray  # (L,) flat position (row * r + column) of the t-th symbol
    classes: np.ndarray  # (L,) int64 base class of the t-th symbol
    runs: list[tuple[int, int, int]]  # (base class, first, end) of each run of equal class


@dataclass
class _Prepared:
    """S streams of one length, ready for the rANS coder: each symbol's fixed-point interval, and the escapes."""

    cumulative: np.ndarray  # (S, L) uint32, class-major symbol order
    frequency: np.ndarray  # (S, L) uint32
    escape_streams: np.ndarray  # (E,) the stream of each escaped value, ascending
    escaped: np.ndarray  # (E,) uint64 the escaped values (offset to 0 .. ESCAPE_RANGE - 1), in stream order

    @property
    def count(self) -> int:
        return self.cumulative.shape[0]

    @property
    def length(self) -> int:
        return self.cumulative.shape[1]


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

    def _prepared(self, codes: np.ndarray, rows: int, shift: np.ndarray) -> _Prepared:
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
        return _Prepared(cumulative, frequency, streams, escaped)

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
            decoded = self._decode_streams([streams[i] for i in members], count, shift)
            for i, part in zip(members, decoded):
                codes[i] = part.view(count, self.columns)
        return codes

    def _decode_streams(self, streams: list[bytes], rows: int, shift: np.ndarray) -> torch.Tensor:
        """S ANS streams of `rows` code rows each, at their shifts -> (S, rows * r) int32 codes (vectorized)."""
        count = len(streams)
        order = self._order(rows)
        length = order.order.size
        sizes = np.array([len(s) // 4 for s in streams])
        words = np.zeros((count, int(sizes.max()) + 1), dtype=np.uint64)  # a zero column: "no word left"
        for i, stream in enumerate(streams):
            words[i, : sizes[i]] = np.frombuffer(stream, dtype=np.uint32)
        everyone = np.arange(count)
        nxt = sizes - 1  # the next word to read of each stream: the stack is read from its end
        state = np.zeros(count, dtype=np.uint64)
        for _ in range(2):  # the initial state: the last word, then one more while it fits below 2^32
            take = (state < np.uint64(1 << WORD_BITS)) & (nxt >= 0)
            state = np.where(take, (state << np.uint64(WORD_BITS)) | words[everyone, np.maximum(nxt, 0)], state)
            nxt = nxt - take
        low, frequency = self._fixed_point()
        n = low.shape[1]
        # Every model's cumulatives in one sorted array: model k's lifted by k * 2^(PRECISION + 1), so one binary
        # search finds each stream's symbol in its own model.
        lift = np.arange(low.shape[0], dtype=np.uint64)[:, None] << np.uint64(PRECISION + 1)
        lifted = (low + lift).ravel()
        classes = (order.classes[None, :] - shift[:, None]).T  # (L, S)
        symbols = np.empty((length, count), dtype=np.int64)  # (L, S): step t writes one contiguous row
        mask = np.uint64((1 << PRECISION) - 1)
        for t in range(length):
            quantile = state & mask
            k = classes[t]
            place = np.searchsorted(lifted, quantile + (k.astype(np.uint64) << np.uint64(PRECISION + 1)),
                                    side="right") - 1  # the interval holding quantile
            symbol = place - k * n
            symbols[t] = symbol
            state, nxt = _pop(state, quantile, low[k, symbol], frequency[k, symbol], words, nxt)
        symbols = symbols.T  # (S, L)
        offset = self.offset.numpy()[classes.T]
        outside = symbols == 2 * offset + 1
        codes = symbols - offset
        members_all, places = np.nonzero(outside)  # the escaped values follow the symbols, in order
        if members_all.size:
            rank = np.arange(members_all.size) - np.searchsorted(members_all, members_all)
            for k in range(int(rank.max()) + 1):
                pick = rank == k
                members = members_all[pick]
                quantile = state[members] & mask
                value = quantile // np.uint64(ESCAPE_FREQUENCY)
                state[members], nxt[members] = _pop(
                    state[members], quantile, value * np.uint64(ESCAPE_FREQUENCY),
                    np.full(members.size, ESCAPE_FREQUENCY, dtype=np.uint64), words[members], nxt[members])
                codes[members, places[pick]] = value.astype(np.int64) - ESCAPE_RANGE // 2
        flat = np.empty_like(codes)
        flat[:, order.order] = codes
        return torch.from_numpy(flat.astype(np.int32))

    def state(self) -> dict[str, torch.Tensor]:
        """The tensors to save (torch.save with weights_only loading)."""
        return {"probs": self.probs, "offset": self.offset, "classes": self.classes}

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> EntropyTable:
        return cls(state["probs"], state["offset"], state["classes"])


def encode_tables(jobs: list[tuple[EntropyTable, list[torch.Tensor], list[int]]]) -> list[list[bytes]]:
    """encode_many of several tables in few numpy passes: per job (table, chunks, shifts), one stream per chunk,
    byte for byte what table.encode(chunk, shift) writes (module docstring). Few chunks go through constriction."""
    if sum(len(chunks) for _, chunks, _ in jobs) < ENCODE_VECTORIZED:
        return [[table.encode(c, shift) for c, shift in zip(chunks, shifts)] for table, chunks, shifts in jobs]
    groups = []  # (symbols per stream, job, rows, members): chunks of one table and one row count
    for j, (table, chunks, shifts) in enumerate(jobs):
        by_rows: dict[int, list[int]] = {}
        for i, codes in enumerate(chunks):
            by_rows.setdefault(codes.shape[0], []).append(i)
        for rows, members in by_rows.items():
            for shift in {shifts[i] for i in members}:
                table._check(shift)
            groups.append((rows * table.columns, j, rows, members))
    groups.sort(key=lambda g: -g[0])

    def prepared(j: int, rows: int, members: list[int]) -> _Prepared:
        table, chunks, shifts = jobs[j]
        codes = torch.stack([chunks[i] for i in members]).reshape(len(members), -1).int().numpy()
        return table._prepared(codes, rows, np.array([shifts[i] for i in members], dtype=np.int64))

    out: list[list[bytes | None]] = [[None] * len(chunks) for _, chunks, _ in jobs]
    batch, size = [], 0
    for group in [*groups, None]:  # batches of at most ENCODE_BATCH_SYMBOLS, prepared one batch at a time
        symbols = 0 if group is None else group[0] * len(group[3])
        if batch and (group is None or size + symbols > ENCODE_BATCH_SYMBOLS):
            streams = iter(_encode_streams([prepared(j, rows, members) for _, j, rows, members in batch]))
            for _, j, _, members in batch:
                for i in members:
                    out[j][i] = next(streams)
            batch, size = [], 0
        if group is not None:
            batch.append(group)
            size += symbols
    return out


def _encode_streams(parts: list[_Prepared]) -> list[bytes]:
    """The rANS stack coder over every stream of `parts` at once (longest first) -> each stream's bytes, in order.

    Each stream pushes its escaped values (the last first), then its symbols from its last one: at step t
    the streams longer than t push their symbol (length - 1 - t); they are laid out longest first, so those
    are a prefix. Then each writes its final state, low word first (constriction's AnsCoder, encode_reverse).
    """
    order = sorted(range(len(parts)), key=lambda i: -parts[i].length)
    count = sum(p.count for p in parts)
    longest = max(p.length for p in parts)
    # (T, S): step t reads one contiguous row; a stream's entries past its length are never read
    cumulative = np.empty((longest, count), dtype=np.uint32)
    frequency = np.empty((longest, count), dtype=np.uint32)
    first, column, active = {}, 0, np.zeros(longest, dtype=np.int64)
    for i in order:
        part = parts[i]
        first[i] = column
        cumulative[: part.length, column : column + part.count] = part.cumulative[:, ::-1].T
        frequency[: part.length, column : column + part.count] = part.frequency[:, ::-1].T
        column += part.count
        active[: part.length] = column
    state = np.zeros(count, dtype=np.uint64)
    owners: list[np.ndarray] = []  # the stream of every word written, in the order written
    words: list[np.ndarray] = []
    streams = np.concatenate([parts[i].escape_streams + first[i] for i in order])
    if streams.size:  # escaped values: pushed first (a stack), so decoded last
        escaped = np.concatenate([parts[i].escaped for i in order])
        ranked = np.argsort(streams, kind="stable")
        streams, escaped = streams[ranked], escaped[ranked]
        rank = np.arange(streams.size) - np.searchsorted(streams, streams)  # index of each escape in its stream
        for k in range(int(rank.max()), -1, -1):
            pick = rank == k
            members = streams[pick]
            frequency_k = np.full(members.size, ESCAPE_FREQUENCY, dtype=np.uint64)
            state[members] = _push(state[members], escaped[pick] * np.uint64(ESCAPE_FREQUENCY), frequency_k,
                                   members, owners, words)
    everyone = np.arange(count)
    for t in range(longest):
        n = active[t]
        state[:n] = _push(state[:n], cumulative[t, :n], frequency[t, :n], everyone[:n], owners, words)
    low_word, high_word = state & np.uint64(0xFFFFFFFF), state >> np.uint64(WORD_BITS)
    for keep, word in ((state > 0, low_word), (high_word > 0, high_word)):  # the final state, low word first
        owners.append(everyone[keep])
        words.append(word[keep])
    owner = np.concatenate(owners)
    rank = np.argsort(owner, kind="stable")
    data = np.concatenate(words).astype(np.uint32)[rank]
    bounds = np.searchsorted(owner[rank], np.arange(count + 1))
    by_column = [data[bounds[c] : bounds[c + 1]].tobytes() for c in range(count)]
    return [stream for i in range(len(parts)) for stream in by_column[first[i] : first[i] + parts[i].count]]


def _push(state: np.ndarray, cumulative: np.ndarray, frequency: np.ndarray, streams: np.ndarray,
          owners: list[np.ndarray], words: list[np.ndarray]) -> np.ndarray:
    """One rANS encode step on every stream at once (constriction's AnsCoder.encode_symbol): the new states.

    A state that would overflow first writes its low word (recorded in owners / words) and drops it.
    """
    full = np.flatnonzero((state >> np.uint64(64 - PRECISION)) >= frequency)
    if full.size:
        owners.append(streams[full])
        words.append(state[full] & np.uint64(0xFFFFFFFF))
        state = state.copy()
        state[full] >>= np.uint64(WORD_BITS)
    prefix, remainder = np.divmod(state, frequency)
    return (prefix << np.uint64(PRECISION)) | (cumulative + remainder)


def _pop(state: np.ndarray, quantile: np.ndarray, cumulative: np.ndarray, frequency: np.ndarray, words: np.ndarray,
         nxt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One rANS decode step on every stream at once (AnsCoder.decode_symbol): the new states and next word indices.

    words: (S, K + 1) each stream's words; a state that falls below 2^32 reads the word at nxt (when one is left).
    """
    state = (state >> np.uint64(PRECISION)) * frequency + (quantile - cumulative)
    refill = np.flatnonzero((state < np.uint64(1 << WORD_BITS)) & (nxt >= 0))
    if refill.size:
        state[refill] = (state[refill] << np.uint64(WORD_BITS)) | words[refill, nxt[refill]]
        nxt = nxt.copy()
        nxt[refill] -= 1
    return state, nxt
