"""The rANS stack coder's arithmetic in numpy, across many streams at once (codecs/ans.py's path without a C compiler).

encode_many writes the very bytes constriction writes, with the coder's arithmetic in numpy across
streams instead of one call per stream: the symbols' fixed-point cumulatives and frequencies are those of
constriction's categorical model (`perfect=False`: float32 prefix sums scaled to 2^24 - n, plus one
count per symbol), computed once per table, and each step of the rANS stack coder (32-bit words, 64-bit
state) runs over every stream at once, each stream with its own shift. A chunk of 8 tokens of smollm2-135m
holds 8 x 212-384 symbols, so a long prompt's hundreds of chunks per layer cost some 3,000 numpy steps
instead of hundreds of constriction calls. Streams stay independent: each still decodes on its own.
decode_many is the same in reverse (the symbol of a quantile: a binary search in the model's cumulatives).
A numpy step costs about as much for 512 streams as for 64, so encode_tables_numpy runs the streams of several
tables (a flush of many layers, each with its own table) side by side: streams of different lengths end
together (the coder starts from each stream's last symbol), and each stream still gets exactly its bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:  # the tables this coder runs; codecs/ans.py imports this module, not the other way
    from codeckv.codecs.ans import EntropyTable

ESCAPE_RANGE = 1 << 16  # escaped values are stored in 16 bits (clipped to +-32767)
PRECISION = 24  # constriction's default ANS coder: 24-bit probabilities, 32-bit words, 64-bit state
WORD_BITS = 32
ESCAPE_FREQUENCY = (1 << PRECISION) // ESCAPE_RANGE  # the Uniform(ESCAPE_RANGE) model: every value 2^24 / 2^16
# From how many streams on encode_tables_numpy (all its chunks) and decode_many (streams of one length) take the
# numpy coder: one numpy step per symbol costs about as much for 16 streams as for 128, so few streams go
# through constriction. Measured on chunks of smollm2-135m (354 components): encoding 64 chunks took 0.60 s
# with constriction and 0.50 s in numpy, 128 chunks 1.36 s and 0.58 s; decoding 128 chunks 0.78 s and 1.23 s
# (a loaded 2-core CPU).
ENCODE_VECTORIZED = 48
ENCODE_BATCH_SYMBOLS = 1 << 23  # symbols one numpy pass codes at most (its uint32 tables: 64 MiB)
DECODE_VECTORIZED = 160


@dataclass
class Prepared:
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


def encode_tables_numpy(jobs: list[tuple[EntropyTable, list[torch.Tensor], list[int]]]) -> list[list[bytes]]:
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

    def prepared(j: int, rows: int, members: list[int]) -> Prepared:
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


def _encode_streams(parts: list[Prepared]) -> list[bytes]:
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


def decode_streams(table: EntropyTable, streams: list[bytes], rows: int, shift: np.ndarray) -> torch.Tensor:
    """S ANS streams of `rows` code rows each, at their shifts -> (S, rows * r) int32 codes (vectorized)."""
    count = len(streams)
    order = table._order(rows)
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
    low, frequency = table._fixed_point()
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
    offset = table.offset.numpy()[classes.T]
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
