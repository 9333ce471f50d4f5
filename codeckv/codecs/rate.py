"""Rate control of the PCA tiers: each archived chunk's quantizer step, from a signalled ladder, within a budget.

A layer's coder (codecs/pca.py) has one calibrated step s. Each chunk is coded at one rung of the ladder

    rung j < SKIP:  step s * 2^(LADDER[j] / 4)        (LADDER = -6 .. 9: 0.35 s .. 4.76 s)
    rung SKIP:      every code 0, no stream           (the chunk decodes to the layer's mean)

and stores its rung in a one-byte header. The budget is the tier's bits per K/V element b, counted as the
archive counts bytes (ANS stream, its length, the header, the sink tokens coded apart). After t archived
tokens of B rows and d elements each, a layer may have spent

    allowed(t) = b / 8 * B * d * t + sink * max(0, 1 - t / REPAY_TOKENS)

bytes, sink = the bytes of its sink tokens: the sink's 8-bit groups are paid back over the first
REPAY_TOKENS tokens. Each chunk takes the finest rung whose bytes fit in allowed(t after it) minus what the
layer spent before it, among the rungs its coder evaluated for it (every 4th rung and the coarsest, then those
between the one it took and the next finer: codecs/pca.py); when none fits, the skip rung (always fits: it
costs 5 bytes plus any sink). What a chunk leaves unspent stays in the layer's allowance, so the next chunk
may take a finer step there.

The guarantee, at every chunk boundary of every layer: stored bytes <= allowed(t), i.e. within the tier's
size exactly from REPAY_TOKENS tokens on, and at most one sink's bytes over before. It rests on the stream
bound ceil(ideal bits / 8) + STREAM_SLACK_BYTES (codecs/ans.py), which the chunk's estimate uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codeckv.codecs.ans import LENGTH_BYTES

RUNGS_PER_OCTAVE = 4
LADDER = tuple(range(-6, 10))  # rung j: step * 2^(LADDER[j] / RUNGS_PER_OCTAVE)
SKIP = len(LADDER)  # the rung that stores no codes
CENTRE = LADDER.index(0)  # the calibrated step
HEADER_BYTES = 1  # the rung of every chunk
REPAY_TOKENS = 64  # the sink tokens' bytes are paid back over this many archived tokens


def ladder_steps(step: float) -> torch.Tensor:
    """(SKIP + 1,) float32: the quantizer step of every rung (the skip rung: 1, its codes are all 0)."""
    return torch.tensor([step * 2 ** (i / RUNGS_PER_OCTAVE) for i in LADDER] + [1.0], dtype=torch.float32)


@dataclass(frozen=True)
class Spent:
    """What a layer's archive holds so far: its bytes, archived tokens, and the bytes of its sink tokens."""

    bytes: int = 0
    tokens: int = 0
    sink_bytes: int = 0


NOTHING = Spent()  # an empty archive


@dataclass(frozen=True)
class RateBudget:
    """A layer's byte allowance: bits_per_element over elements_per_token (B rows x d) per archived token."""

    bits_per_element: float
    elements_per_token: int

    def allowed(self, tokens: int, sink_bytes: int) -> float:
        """The bytes a layer may hold after `tokens` archived tokens whose sink tokens took sink_bytes."""
        repay = max(0.0, 1.0 - tokens / REPAY_TOKENS)
        return self.bits_per_element / 8 * self.elements_per_token * tokens + sink_bytes * repay

    def choose(self, costs: torch.Tensor, sink_bytes: list[int], before: Spent, unit: int) -> list[int]:
        """Rungs for consecutive chunks of `unit` tokens from their estimated stream bytes (module docstring).

        costs: (chunks, SKIP) estimated bytes of each chunk's stream at each rung; sink_bytes: each chunk's
        sink bytes; before: what the layer held before these chunks.
        """
        rungs = []
        spent, tokens, layer_sink = before.bytes, before.tokens, before.sink_bytes
        overhead = HEADER_BYTES + LENGTH_BYTES
        for cost, sink in zip(costs.tolist(), sink_bytes):
            tokens += unit
            layer_sink += sink
            room = self.allowed(tokens, layer_sink) - spent - overhead - sink
            rung = next((j for j, c in enumerate(cost) if c <= room), SKIP)
            rungs.append(rung)
            spent += overhead + sink + (0 if rung == SKIP else cost[rung])
        return rungs
