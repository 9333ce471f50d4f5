"""Compression while decoding, as kvpress 0.5.5's DecodingPress and CompressionRatioDecodingPress do it.

    Decoding(TOVAPress(), tokens=256, interval=16)             # what the tier tova-decoding256 holds
    Decoding(TOVAPress(), share=0.5, interval=16)              # tova-decoding-50: half of every token seen evicted

The context's prefill (the first forward into an empty layer) is never pressed. Every later forward is a decoding
step: the layer keeps the queries of its last `buffer` forwards (kvpress buffers their hidden states), counts the
step, and at the `interval`-th step since the last compression (or a forward of at least the target's tokens) it
scores every token it holds with its press and keeps the target's best: `tokens`, or with `share` the tokens seen so
far less that share (max(1, int(seen x (1 - share))), CompressionRatioDecodingPress's target). The count restarts
and the buffer empties whether or not anything was evicted, as in kvpress's forward_hook. So a budget of 256 on a
724-token prompt holds the whole prompt for the first `interval` steps, then 256 tokens, growing to 256 + interval
before each compression. Budget (presses/budget.py) is the other protocol: its prefill is pressed too.

A Decoding press is a Budget (its tokens stay raw; no codec composes with it), so every runner treats it as one.
"""

from __future__ import annotations

from dataclasses import dataclass

from codeckv.presses.budget import MAX_TOKENS, Budget


@dataclass(frozen=True)
class Decoding(Budget):
    """kvpress's DecodingPress (`tokens`) or CompressionRatioDecodingPress (`share` > 0): module docstring."""

    share: float = 0.0  # CompressionRatioDecodingPress's target_compression_ratio; 0 keeps `tokens`
    buffer: int = 256  # hidden_states_buffer_size: the forwards whose queries are kept for scoring

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.share, bool) or not isinstance(self.share, float | int) or not 0 <= self.share < 1:
            raise ValueError(f"Decoding: share={self.share!r} must be a share of the tokens seen in [0, 1)")
        if isinstance(self.buffer, bool) or not isinstance(self.buffer, int) or not 0 <= self.buffer <= MAX_TOKENS:
            raise ValueError(f"Decoding: buffer={self.buffer!r} must be a whole number in 0..{MAX_TOKENS}")

    def target(self, seen: int) -> int:
        """Tokens a compression keeps after `seen` tokens (the current forward's included)."""
        return max(1, int(seen * (1 - self.share))) if self.share else self.tokens

    def due(self, steps: int, new: int, seen: int) -> bool:
        """True when the `steps`-th decoding step since the last compression, `new` tokens, compresses."""
        return steps >= self.interval or new >= self.target(seen)
