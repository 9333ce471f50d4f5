"""Joint PCA transform coding of one layer's keys and values (KVTC-style), with entropy-coded codes.

Per token, the keys and values of every KV head of a layer form one vector x of d = H * (D + Dv)
numbers, keys de-rotated first (RoPE removed, codeckv/codecs/rope.py: position-free keys share one basis).
Calibration (codeckv/cache/calibration.py) gives each layer constants, stored with the model, not per token:

    mean   (d,)     calibration mean
    enc    (d, r)   analysis: y = (x - mean) @ enc           Fisher-whitened PCA basis, r components kept
    dec    (r, d)   synthesis: x^ = y^ @ dec + mean          (enc's pseudo-inverse)
    step            the calibrated ECSQ step (reverse water-filling in the whitened domain)
    table           EntropyTable of the codes (codecs/ans.py): models by class, each component's class

    q = sign(y) * floor(|y| / step_j + 1/2)     the integer codes at the chunk's rung j (entropy-constrained SQ)
    y^ = q * step_j                             components that never leave 0 on calibration are dropped

The basis is whitened by the Fisher information of the loss (E[g g^T] of the gradients w.r.t. K and V),
so equal squared error in every component means equal expected loss: one step for all components
is the optimal bit allocation, and the entropy coder turns near-zero components into near-zero bits.

An archived chunk (`unit` tokens) stores one ANS stream of its codes and its rung: the rate control
(codecs/rate.py) picks, per chunk, the step of a ladder around the calibrated one that keeps the layer
within the tier's bits per element on any text. Tokens at positions below `sink_tokens` (the attention
sink: an outlier the calibrated basis does not fit) are coded apart with 8-bit min/max groups
(codecs/quant.py), in the chunk that holds them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from codeckv.codecs.ans import ESCAPE_RANGE, LENGTH_BYTES, STREAM_SLACK_BYTES, EntropyTable, encode_tables
from codeckv.codecs.base import Encoded
from codeckv.codecs.fit import for_head_dim
from codeckv.codecs.quant import GroupQuant
from codeckv.codecs.rate import HEADER_BYTES, LADDER, NOTHING, SKIP, RateBudget, Spent, ladder_steps
from codeckv.codecs.rope import Rope
from codeckv.kernel_package import kernel_module

SINK_CODEC = GroupQuant(bits=8, group=32)


def sink_codec(head_dim: int) -> GroupQuant:
    """SINK_CODEC for rows of head_dim channels (codecs/fit.py: its groups shrink where 32 does not divide them)."""
    return for_head_dim(SINK_CODEC, head_dim)
COST_LIMIT = 255  # codes beyond +-COST_LIMIT are estimated at their escape's cost: the models' largest M_k
COST_UNITS = 1 << 16  # the rate control's code costs are integers: 1 / COST_UNITS bit each
ANCHOR_SPACING = 4  # the rate control evaluates every 4th rung for every chunk, then the few its choice needs
UNKNOWN_BYTES = 1 << 40  # a rung not evaluated for a chunk: never chosen


@dataclass(frozen=True)
class JointPCA:
    """A PCA tier's bit budget (which also centres the calibrated step) and how much calibration text."""

    bits_per_element: float  # the budget: stored bits per K/V element, everything counted (codecs/rate.py)
    sink_tokens: int = 1  # positions < sink_tokens are coded apart (8-bit groups)
    calibration_windows: int = 32  # calibration text: windows x tokens, 16k tokens (codeckv/cache/calibration.py)
    calibration_length: int = 512

    def __post_init__(self) -> None:
        if not 0 < self.bits_per_element <= 16:
            raise ValueError(f"JointPCA: bits_per_element={self.bits_per_element!r} (allowed: 0 < bits <= 16)")
        for name in ("sink_tokens", "calibration_windows", "calibration_length"):
            value = getattr(self, name)
            least = 0 if name == "sink_tokens" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"JointPCA: {name}={value!r} must be an integer >= {least}")


def ecsq(y: torch.Tensor, step: float) -> torch.Tensor:
    """Uniform scalar quantization to the nearest multiple of step: (..., r) float -> int32 codes."""
    return torch.round(y / step).to(torch.int32)


def ecsq_rows(y: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """ecsq of (B, S, r) components with one step per row ((S,) steps) or one for all (a 0-d tensor)."""
    steps = steps[None, :, None] if steps.dim() else steps
    return torch.round(y / steps).nan_to_num_(0.0).to(torch.int32)


def _row_costs(y: torch.Tensor, steps: torch.Tensor, shifts: torch.Tensor, classes: torch.Tensor,
               costs: torch.Tensor) -> torch.Tensor:
    """(B, S', r) components, each row's step and class shift (S',), the columns' classes (r,), the (K * width,)
    integer cost table -> (S',) int64: each row's summed cost of its codes (ecsq_rows's, clamped to +-COST_LIMIT + 1).
    The compiled pass where it is built (kernels/ans_cpu.c), else torch; integer sums: the two agree exactly."""
    compiled = kernel_module("ans_cpu")
    if compiled.ans_available():
        return compiled.ans_costs(y, steps, shifts, classes, costs, COST_LIMIT)
    width = 2 * COST_LIMIT + 3
    place = (classes[None, :] - shifts[:, None]) * width + COST_LIMIT + 1  # (S', r): where q = 0's cost is
    # ecsq_rows's codes (steps are finite here), clamped and placed in float: one pass fewer per op; an int32
    # index and index_select read half the bytes take's int64 index does (twice as fast here)
    where = (y / steps[None, :, None]).round_().clamp_(-COST_LIMIT - 1, COST_LIMIT + 1).add_(place.float()).int()
    return costs.index_select(0, where.view(-1)).view(where.shape).sum((0, 2))


@dataclass
class Chunk:
    """What the archive holds for one chunk: its rung, the ANS stream of its codes, its sink tokens coded apart."""

    stream: bytes
    rung: int  # codecs/rate.py: the ladder rung of its step (SKIP: no codes, an empty stream)
    sink: tuple[Encoded, Encoded] | None = None  # keys, values of the chunk's leading sink tokens

    @property
    def sink_bytes(self) -> int:
        return sum(e.nbytes for e in self.sink) if self.sink else 0

    @property
    def nbytes(self) -> int:
        return len(self.stream) + LENGTH_BYTES + HEADER_BYTES + self.sink_bytes


def spent(chunks: list[Chunk], unit: int) -> Spent:
    """What a layer's chunks hold (codecs/rate.py): their bytes, tokens and sink bytes."""
    return Spent(sum(c.nbytes for c in chunks), len(chunks) * unit, sum(c.sink_bytes for c in chunks))


@dataclass
class _Plan:
    """What LayerCoder._plan decided for some tokens: rungs, sinks, codes, and the parts the entropy coder codes."""

    rungs: list[int]  # per chunk
    sinks: list  # per chunk: its sink tokens' (keys, values) Encoded, or None
    codes: torch.Tensor  # (B, S', r) int32 codes of the rows after the sinks
    row_steps: torch.Tensor  # (S',)
    parts: list[torch.Tensor]  # per chunk not at the skip rung: its (B * rows, r) codes
    shifts: list[int]  # their rungs' class shifts


def archive_layers(requests: list[tuple]) -> list[tuple[list[Chunk], tuple[torch.Tensor, torch.Tensor]]]:
    """LayerCoder.archive for several layers at once, (coder, keys, values, start, unit, budget, before) each:
    every layer's chunks and decoded (keys, values), as its own archive gives, with one entropy-coding pass
    over all of their streams (ans.encode_tables: a flush of many layers, codeckv/cache/flush.py)."""
    plans = [coder._plan(*args) for coder, *args in requests]
    streams = encode_tables([(coder.table, plan.parts, plan.shifts) for (coder, *_), plan in zip(requests, plans)])
    results = []
    for (coder, keys, _, start, *_), plan, coded in zip(requests, plans, streams):
        chunks = coder._chunks(plan, coded)
        sink_parts = [c.sink for c in chunks if c.sink]
        results.append((chunks, coder._reconstruct(plan.codes, plan.row_steps, sink_parts, start, keys.dtype)))
    return results


@dataclass
class LayerCoder:
    """One layer's calibrated transform coder (module docstring): K and V (B, H, S, D) <-> chunks."""

    mean: torch.Tensor  # (d,)
    enc: torch.Tensor  # (d, r)
    dec: torch.Tensor  # (r, d)
    step: float
    table: EntropyTable
    heads: int
    head_dim: int  # keys; values have (d - heads * head_dim) / heads channels
    rope: Rope
    sink_tokens: int = 1
    component_bits: torch.Tensor | None = None  # (r,) mean bits per token of each component on calibration
    _costs: torch.Tensor | None = field(default=None, repr=False, compare=False)  # stream_bytes's costs, flat, int64

    @property
    def kept(self) -> int:
        return self.enc.shape[1]

    @property
    def steps(self) -> torch.Tensor:
        """(SKIP + 1,) the step of every rung (codecs/rate.py)."""
        return ladder_steps(self.step)

    def rows(self, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
        """Keys (RoPE removed) and values (B, H, S, D) at positions start.. -> (B, S, d) float32 vectors."""
        b, h, s, _ = keys.shape
        k = self.rope.remove(keys.float(), start).transpose(1, 2).reshape(b, s, -1)
        v = values.float().transpose(1, 2).reshape(b, s, -1)
        return torch.cat([k, v], dim=-1)

    def unrows(self, x: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inverse of rows: (B, S, d) vectors -> keys (RoPE re-applied), values (B, H, S, D) float32."""
        b, s, d = x.shape
        split = self.heads * self.head_dim
        k = x[..., :split].reshape(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = x[..., split:].reshape(b, s, self.heads, (d - split) // self.heads).transpose(1, 2)
        return self.rope.apply(k, start), v

    def budget(self, bits_per_element: float, batch: int) -> RateBudget:
        """The RateBudget of `batch` rows of this layer at a tier's bits per element."""
        return RateBudget(bits_per_element, batch * self.mean.numel())

    def encode(self, keys: torch.Tensor, values: torch.Tensor, start: int, unit: int, budget: RateBudget,
               before: Spent = NOTHING) -> list[Chunk]:
        """Keys, values (B, H, S, D) at positions start.. (S a multiple of unit) -> one Chunk per unit tokens.

        before: what the layer's archive held before these tokens (the rate control's running budget).
        """
        plan = self._plan(keys, values, start, unit, budget, before)
        return self._chunks(plan, self.table.encode_many(plan.parts, plan.shifts))

    def archive(self, keys: torch.Tensor, values: torch.Tensor, start: int, unit: int, budget: RateBudget,
                before: Spent = NOTHING):
        """encode, and what decode of those chunks gives, computed from the codes (no entropy decoding).

        -> (chunks, (keys, values) in keys' dtype), the decoded tensors bit for bit those of decode(chunks):
        ANS is lossless, so the stored streams decode to these very codes, and both paths run the same ops.
        """
        return archive_layers([(self, keys, values, start, unit, budget, before)])[0]

    def project(self, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
        """Keys, values (B, H, S, D) at positions start.. -> (B, S, r) float32 components y."""
        return (self.rows(keys, values, start) - self.mean) @ self.enc

    def quantize(self, y: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        """(B, S, r) components, (S,) or () steps -> (B, S, r) int32 codes, within what a stream can hold."""
        codes = ecsq_rows(y, steps)
        return codes.clamp_(-(ESCAPE_RANGE // 2), ESCAPE_RANGE // 2 - 1)  # escapes store 16 bits (codecs/ans.py)

    def _sinks(self, start: int, tokens: int) -> int:
        """How many of `tokens` tokens from position start are sink tokens (coded apart)."""
        return min(max(self.sink_tokens - start, 0), tokens)

    def stream_bytes(self, y: torch.Tensor, bounds: list[int], rungs: torch.Tensor) -> torch.Tensor:
        """(B, S', r) components, chunk row bounds (chunks + 1,), one rung per chunk (chunks,) -> (chunks,) int64
        upper bounds of each chunk's stream bytes at its rung (the coder's fixed-point code lengths, codecs/ans.py,
        each rounded up to 1 / COST_UNITS bit: integer sums, the same on any path, CPU and thread count)."""
        if self._costs is None:
            self._costs = (self.table.code_bits(COST_LIMIT).double() * COST_UNITS).ceil().long().reshape(-1)
        edges = torch.tensor(bounds)
        counts = edges.diff()
        shifts = torch.tensor(LADDER)[rungs].repeat_interleave(counts)  # (S',) each row's rung's shift
        steps = self.steps[rungs].repeat_interleave(counts)
        per_row = _row_costs(y, steps, shifts, self.table.classes, self._costs)
        total = torch.cat([torch.zeros(1, dtype=torch.long), per_row.cumsum(0)])
        byte = 8 * COST_UNITS
        return (total[edges[1:]] - total[edges[:-1]] + byte - 1).div(byte, rounding_mode="floor") + STREAM_SLACK_BYTES

    def _choose(self, y: torch.Tensor, bounds: list[int], sink_bytes: list[int], budget: RateBudget,
                before: Spent, unit: int) -> list[int]:
        """Each chunk's rung (codecs/rate.py) from few evaluated rungs: every ANCHOR_SPACING-th and the coarsest
        for every chunk, then, for each chunk, those between the anchor it took and the next finer anchor; the
        rule is the same (the finest evaluated rung that fits), on exact bounds."""
        chunks = len(bounds) - 1
        costs = torch.full((chunks, SKIP), UNKNOWN_BYTES, dtype=torch.long)
        for rung in sorted({*range(0, SKIP, ANCHOR_SPACING), SKIP - 1}):
            costs[:, rung] = self.stream_bytes(y, bounds, torch.full((chunks,), rung))
        first = torch.tensor(budget.choose(costs, sink_bytes, before, unit))
        finer_anchor = (first - 1).div(ANCHOR_SPACING, rounding_mode="floor") * ANCHOR_SPACING
        for back in range(1, ANCHOR_SPACING):
            rung = first - back
            todo = (first < SKIP) & (rung > finer_anchor) & (rung >= 0)
            if not bool(todo.any()):
                break
            rung = torch.where(todo, rung, first.clamp(max=SKIP - 1))  # elsewhere: a rung already evaluated
            costs[torch.arange(chunks), rung] = self.stream_bytes(y, bounds, rung)
        return budget.choose(costs, sink_bytes, before, unit)

    def _plan(self, keys: torch.Tensor, values: torch.Tensor, start: int, unit: int, budget: RateBudget,
              before: Spent) -> _Plan:
        """The chunks of the tokens from position start, up to the entropy coder: each one's rung and sinks, the
        (B, S', r) codes after the sinks, their (S',) row steps, and the parts to entropy-code."""
        sinks = self._sinks(start, keys.shape[2])
        y = self.project(keys[:, :, sinks:], values[:, :, sinks:], start + sinks)  # (B, S', r)
        bounds, sink_parts = [0], []
        for first in range(0, keys.shape[2], unit):
            lo = max(first, sinks)  # sink rows are not PCA-coded
            sink = None
            if lo > first:
                sink = (sink_codec(keys.shape[3]).encode(keys[:, :, first:lo]),
                        sink_codec(values.shape[3]).encode(values[:, :, first:lo]))
            sink_parts.append(sink)
            bounds.append(first + unit - sinks)
        sink_bytes = [sum(e.nbytes for e in sink) if sink else 0 for sink in sink_parts]
        rungs = self._choose(y, bounds, sink_bytes, budget, before, unit)
        row_steps = self._row_steps(rungs, bounds)
        codes = self.quantize(y, row_steps)
        parts, shifts = [], []
        for j, rung in enumerate(rungs):
            if rung != SKIP:
                parts.append(codes[:, bounds[j] : bounds[j + 1]].reshape(-1, self.kept))
                shifts.append(LADDER[rung])
        return _Plan(rungs, sink_parts, codes, row_steps, parts, shifts)

    def _chunks(self, plan: _Plan, streams: list[bytes]) -> list[Chunk]:
        """The plan's chunks, given the streams of its coded parts (chunks at the skip rung store none)."""
        streams = iter(streams)
        return [Chunk(b"" if rung == SKIP else next(streams), rung, sink)
                for rung, sink in zip(plan.rungs, plan.sinks)]

    def _row_steps(self, rungs: list[int], bounds: list[int]) -> torch.Tensor:
        """(S',) the step of every PCA-coded row: its chunk's rung's (NaN for the skip rung)."""
        steps = torch.cat([self.steps[:SKIP], torch.tensor([math.nan])])
        counts = torch.tensor([bounds[j + 1] - bounds[j] for j in range(len(rungs))])
        return steps[torch.tensor(rungs, dtype=torch.long)].repeat_interleave(counts)

    def decode(self, chunks: list[Chunk], start: int, unit: int, batch: int, dtype: torch.dtype):
        """Inverse of encode: chunks of unit tokens from position start -> keys, values (B, H, S, D) in dtype."""
        rows = [unit - (chunk.sink[0].shape[2] if chunk.sink else 0) for chunk in chunks]
        coded = [j for j, chunk in enumerate(chunks) if chunk.rung != SKIP]
        decoded = self.table.decode_many([chunks[j].stream for j in coded], [batch * rows[j] for j in coded],
                                         [LADDER[chunks[j].rung] for j in coded])
        codes = [torch.zeros(batch, r, self.kept, dtype=torch.int32) for r in rows]
        for j, part in zip(coded, decoded):
            codes[j] = part.view(batch, rows[j], self.kept)
        bounds = [0, *torch.tensor(rows).cumsum(0).tolist()]
        row_steps = self._row_steps([chunk.rung for chunk in chunks], bounds)
        return self._reconstruct(torch.cat(codes, dim=1), row_steps, [c.sink for c in chunks if c.sink], start,
                                 dtype)

    def _reconstruct(self, codes: torch.Tensor, row_steps: torch.Tensor, sinks: list[tuple[Encoded, Encoded]],
                     start: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, S', r) codes after the sink tokens, their (S',) steps, and the sinks' encodings -> keys, values."""
        y = codes.float() * row_steps.nan_to_num(0.0)[None, :, None]  # (B, S', r)
        count = sum(sink[0].shape[2] for sink in sinks)
        keys, values = self.unrows(y @ self.dec + self.mean, start + count)
        if count:
            sink_keys = torch.cat([sink_codec(k.shape[3]).decode(k) for k, _ in sinks], dim=2).float()
            sink_values = torch.cat([sink_codec(v.shape[3]).decode(v) for _, v in sinks], dim=2).float()
            keys, values = torch.cat([sink_keys, keys], dim=2), torch.cat([sink_values, values], dim=2)
        return keys.to(dtype), values.to(dtype)

    def state(self) -> dict:
        """Tensors and numbers to save (loaded back with from_state)."""
        return {
            "mean": self.mean, "enc": self.enc, "dec": self.dec, "step": self.step, "table": self.table.state(),
            "heads": self.heads, "head_dim": self.head_dim, "rope": self.rope.state(),
            "sink_tokens": self.sink_tokens, "component_bits": self.component_bits,
        }

    @classmethod
    def from_state(cls, state: dict) -> LayerCoder:
        return cls(
            state["mean"], state["enc"], state["dec"], state["step"], EntropyTable.from_state(state["table"]),
            state["heads"], state["head_dim"], Rope.from_state(state["rope"]),
            state["sink_tokens"], state["component_bits"],
        )
