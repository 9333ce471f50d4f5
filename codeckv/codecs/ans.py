"""Entropy coding of integer codes with static, calibrated tables: one rANS stream per archived chunk.

    table = EntropyTable.fit(calibration_codes)        # (N, r) int codes -> one categorical model per column
    stream = table.encode(codes)                       # (m, r) int codes -> bytes (what the archive holds)
    streams = table.encode_many([codes, ...])          # many chunks at once: the same bytes, vectorized
    codes = table.decode(stream, m)                    # the exact (m, r) codes back
    codes = table.decode_many(streams, [m, ...])       # many at once

Column i codes symbols q + M_i for q in [-M_i, M_i] (M_i: a high quantile of |q_i| on calibration) and
one escape symbol for anything outside, followed by the value itself in 16 bits. The coder is
`constriction`'s stack-based ANS (Duda 2013): within a few bytes of the ideal code length
-log2 p(codes) per chunk. The tables are calibration constants, stored with the basis, not per chunk.

encode_many writes the very bytes constriction writes, with the coder's arithmetic in numpy across
streams instead of one call per stream: the symbols' fixed-point cumulatives and frequencies are those of
constriction's lazy categorical model (`perfect=False`: float32 prefix sums scaled to 2^24 - n, plus one
count per symbol), computed once per table, and each step of the rANS stack coder (32-bit words, 64-bit
state) runs over every stream at once. A chunk of 8 tokens of smollm2-135m holds 8 x 212-376 symbols (the
components its layer keeps), so a long prompt's hundreds of chunks per layer cost some 3,000 numpy steps
instead of hundreds of constriction calls that each rebuild a model per symbol. Streams stay independent:
each still decodes on its own. decode_many is the same in reverse (the symbol of a quantile: a binary
search in the column's cumulatives).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import constriction
import numpy as np
import torch

ESCAPE_RANGE = 1 << 16  # escaped values are stored in 16 bits (clipped to +-32767)
LENGTH_BYTES = 4  # every stored stream carries its length (counted in nbytes)
PRECISION = 24  # constriction's default ANS coder: 24-bit probabilities, 32-bit words, 64-bit state
WORD_BITS = 32
ESCAPE_FREQUENCY = (1 << PRECISION) // ESCAPE_RANGE  # the Uniform(ESCAPE_RANGE) model: every value 2^24 / 2^16
# From how many streams of one length on encode_many / decode_many take the numpy coder: one numpy step per
# symbol costs about as much for 16 streams as for 128, so few streams go through constriction. Measured on
# chunks of smollm2-135m (354 components): encoding 64 chunks took 0.60 s with constriction and 0.50 s in
# numpy, 128 chunks 1.36 s and 0.58 s; decoding 128 chunks 0.78 s and 1.23 s (a loaded 2-core CPU).
ENCODE_VECTORIZED = 48
DECODE_VECTORIZED = 160
_CATEGORICAL = constriction.stream.model.Categorical(perfect=False)
_ESCAPED = constriction.stream.model.Uniform(ESCAPE_RANGE)


@dataclass
class EntropyTable:
    """One categorical model per column: probs (r, n), offset (r,) = M_i (symbol q + M_i, escape 2 M_i + 1)."""

    probs: torch.Tensor  # (r, n) float32, rows sum to 1, zero past each row's escape symbol
    offset: torch.Tensor  # (r,) int64
    _tiled: dict = field(default_factory=dict, repr=False, compare=False)  # m -> (m * r, n) probs, reused per chunk
    _fixed: tuple | None = field(default=None, repr=False, compare=False)  # (cumulative, frequency) (r, n) uint64

    @classmethod
    def fit(cls, codes: torch.Tensor, coverage: float = 0.9999, max_abs: int = 255, alpha: float = 0.5) -> EntropyTable:
        """Histogram (N, r) calibration codes into tables: M_i = the `coverage` quantile of |q_i| (1..max_abs).

        alpha: add-alpha smoothing, so a code never seen in calibration still costs finitely many bits.
        """
        codes = codes.long()
        r = codes.shape[1]
        m = torch.quantile(codes.abs().float(), coverage, dim=0).ceil().long().clamp(1, max_abs)  # (r,)
        n = int(2 * m.max() + 2)
        symbols = torch.where(codes.abs() <= m, codes + m, 2 * m + 1)  # (N, r); 2M + 1 = escape
        counts = torch.bincount((symbols + torch.arange(r) * n).reshape(-1), minlength=r * n).view(r, n).double()
        valid = torch.arange(n)[None, :] <= 2 * m[:, None] + 1  # (r, n): the symbols of each column
        probs = (counts + alpha) * valid
        return cls((probs / probs.sum(1, keepdim=True)).float(), m)

    @property
    def columns(self) -> int:
        return self.probs.shape[0]

    def bits(self, codes: torch.Tensor) -> torch.Tensor:
        """Ideal code length in bits of each column of (m, r) codes under this table, escapes included -> (r,)."""
        codes = codes.long()
        m = self.offset
        symbols = torch.where(codes.abs() <= m, codes + m, 2 * m + 1)
        p = self.probs.double().gather(1, symbols.T).T  # (m, r)
        escape = (codes.abs() > m).double() * np.log2(ESCAPE_RANGE)
        return (-torch.log2(p) + escape).sum(0)

    def _probs_for(self, rows: int) -> np.ndarray:
        """The (rows * r, n) float32 probabilities of `rows` consecutive code rows (memoized by rows)."""
        if rows not in self._tiled:
            self._tiled[rows] = np.tile(self.probs.numpy(), (rows, 1))
        return self._tiled[rows]

    def encode(self, codes: torch.Tensor) -> bytes:
        """(m, r) integer codes -> one ANS stream."""
        flat = codes.reshape(-1).long().numpy()
        offset = np.tile(self.offset.numpy(), codes.shape[0])
        outside = np.abs(flat) > offset
        symbols = np.where(outside, 2 * offset + 1, flat + offset).astype(np.int32)
        coder = constriction.stream.stack.AnsCoder()
        escaped = np.clip(flat[outside] + ESCAPE_RANGE // 2, 0, ESCAPE_RANGE - 1).astype(np.int32)
        if escaped.size:
            coder.encode_reverse(escaped, _ESCAPED)  # decoded after the symbols (a stack)
        coder.encode_reverse(symbols, _CATEGORICAL, self._probs_for(codes.shape[0]))
        return coder.get_compressed().tobytes()

    def encode_many(self, chunks: list[torch.Tensor]) -> list[bytes]:
        """Many (m_i, r) integer code arrays -> one ANS stream each, byte for byte what encode() writes for each."""
        streams: list[bytes | None] = [None] * len(chunks)
        by_rows: dict[int, list[int]] = {}
        for i, codes in enumerate(chunks):
            by_rows.setdefault(codes.shape[0], []).append(i)
        for members in by_rows.values():
            if len(members) < ENCODE_VECTORIZED:
                for i in members:
                    streams[i] = self.encode(chunks[i])
                continue
            codes = torch.stack([chunks[i] for i in members]).reshape(len(members), -1).long().numpy()
            for i, stream in zip(members, self._encode_streams(codes)):
                streams[i] = stream
        return streams

    def _fixed_point(self) -> tuple[np.ndarray, np.ndarray]:
        """Per column and symbol, the (r, n) uint64 cumulative and frequency constriction's lazy model gives them."""
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

    def _encode_streams(self, codes: np.ndarray) -> list[bytes]:
        """(S, m * r) int64 codes, one stream per row -> S ANS streams (vectorized encode: module docstring)."""
        count, length = codes.shape
        offset = np.tile(self.offset.numpy(), length // self.columns)  # (L,)
        outside = np.abs(codes) > offset
        symbols = np.where(outside, 2 * offset + 1, codes + offset)  # (S, L)
        column = np.arange(length) % self.columns
        # (L, S) uint64 each: step t reads one contiguous row (a column of (S, L) would miss the cache per stream)
        cumulative, frequency = (table[column[:, None], symbols.T] for table in self._fixed_point())
        state = np.zeros(count, dtype=np.uint64)
        owners: list[np.ndarray] = []  # the stream of every word written, in the order written
        words: list[np.ndarray] = []
        rows, places = np.nonzero(outside)  # escaped values: pushed first (a stack), so decoded last
        if rows.size:
            escaped = np.clip(codes[rows, places] + ESCAPE_RANGE // 2, 0, ESCAPE_RANGE - 1).astype(np.uint64)
            rank = np.arange(rows.size) - np.searchsorted(rows, rows)  # index of each escape within its stream
            for k in range(int(rank.max()), -1, -1):
                pick = rank == k
                members = rows[pick]
                frequency_k = np.full(members.size, ESCAPE_FREQUENCY, dtype=np.uint64)
                state[members] = _push(state[members], escaped[pick] * np.uint64(ESCAPE_FREQUENCY), frequency_k,
                                       members, owners, words)
        everyone = np.arange(count)
        for t in range(length - 1, -1, -1):  # encode_reverse: the last symbol first
            state = _push(state, cumulative[t], frequency[t], everyone, owners, words)
        low_word, high_word = state & np.uint64(0xFFFFFFFF), state >> np.uint64(WORD_BITS)
        for keep, word in ((state > 0, low_word), (high_word > 0, high_word)):  # the final state, low word first
            owners.append(everyone[keep])
            words.append(word[keep])
        owner = np.concatenate(owners)
        order = np.argsort(owner, kind="stable")
        data = np.concatenate(words).astype(np.uint32)[order]
        bounds = np.searchsorted(owner[order], np.arange(count + 1))
        return [data[bounds[i] : bounds[i + 1]].tobytes() for i in range(count)]

    def decode(self, stream: bytes, rows: int) -> torch.Tensor:
        """Inverse of encode: one ANS stream -> (rows, r) int32 codes."""
        coder = constriction.stream.stack.AnsCoder(np.frombuffer(stream, dtype=np.uint32).copy())
        symbols = coder.decode(_CATEGORICAL, self._probs_for(rows)).astype(np.int64)
        offset = np.tile(self.offset.numpy(), rows)
        outside = symbols == 2 * offset + 1
        codes = symbols - offset
        if outside.any():
            codes[outside] = coder.decode(_ESCAPED, int(outside.sum())).astype(np.int64) - ESCAPE_RANGE // 2
        return torch.from_numpy(codes.astype(np.int32)).view(rows, self.columns)

    def decode_many(self, streams: list[bytes], rows: list[int]) -> list[torch.Tensor]:
        """Inverse of encode_many: streams of rows[i] code rows each -> (rows[i], r) int32 codes, as decode() gives."""
        codes: list[torch.Tensor | None] = [None] * len(streams)
        by_rows: dict[int, list[int]] = {}
        for i, count in enumerate(rows):
            by_rows.setdefault(count, []).append(i)
        for count, members in by_rows.items():
            if len(members) < DECODE_VECTORIZED:
                for i in members:
                    codes[i] = self.decode(streams[i], count)
                continue
            decoded = self._decode_streams([streams[i] for i in members], count * self.columns)
            for i, part in zip(members, decoded):
                codes[i] = part.view(count, self.columns)
        return codes

    def _decode_streams(self, streams: list[bytes], length: int) -> torch.Tensor:
        """S ANS streams of `length` symbols each -> (S, length) int32 codes (constriction's decoder, vectorized)."""
        count = len(streams)
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
        column = np.arange(length) % self.columns
        symbols = np.empty((length, count), dtype=np.int64)  # (L, S): step t writes one contiguous row
        mask = np.uint64((1 << PRECISION) - 1)
        for t in range(length):
            quantile = state & mask
            symbol = np.searchsorted(low[column[t]], quantile, side="right") - 1  # the interval holding quantile
            symbols[t] = symbol
            state, nxt = _pop(state, quantile, low[column[t], symbol], frequency[column[t], symbol], words, nxt)
        symbols = symbols.T  # (S, L)
        offset = np.tile(self.offset.numpy(), length // self.columns)
        outside = symbols == 2 * offset + 1
        codes = symbols - offset
        rows, places = np.nonzero(outside)  # the escaped values follow the symbols, in order
        if rows.size:
            rank = np.arange(rows.size) - np.searchsorted(rows, rows)
            for k in range(int(rank.max()) + 1):
                pick = rank == k
                members = rows[pick]
                quantile = state[members] & mask
                value = quantile // np.uint64(ESCAPE_FREQUENCY)
                state[members], nxt[members] = _pop(
                    state[members], quantile, value * np.uint64(ESCAPE_FREQUENCY),
                    np.full(members.size, ESCAPE_FREQUENCY, dtype=np.uint64), words[members], nxt[members])
                codes[members, places[pick]] = value.astype(np.int64) - ESCAPE_RANGE // 2
        return torch.from_numpy(codes.astype(np.int32))

    def state(self) -> dict[str, torch.Tensor]:
        """The tensors to save (torch.save with weights_only loading)."""
        return {"probs": self.probs, "offset": self.offset}

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> EntropyTable:
        return cls(state["probs"], state["offset"])


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
