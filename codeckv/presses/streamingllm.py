"""StreamingLLM (Xiao et al., 2023): keep the first tokens (attention sinks) and the most recent ones.

As kvpress 0.5.5's `kvpress/presses/streaming_llm_press.py` (StreamingLLMPress, n_sink=4): the `sinks` first tokens
and the newest of the rest are kept; the keys keep the positions they were rotated at (no re-rotation, as kvpress
without its KeyRerotationPress wrapper).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codeckv.presses.base import Press, Rope


@dataclass(frozen=True)
class StreamingLLMPress(Press):
    """Keep `sinks` first tokens and then the newest; evict the middle."""

    sinks: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.sinks, bool) or not isinstance(self.sinks, int) or self.sinks < 0:
            raise ValueError(f"StreamingLLMPress: sinks={self.sinks!r} must be a whole number >= 0")

    def scores(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor,
               rope: Rope | None = None) -> torch.Tensor:
        b, h, s, _ = keys.shape
        position = torch.arange(s, dtype=torch.float32, device=keys.device)
        score = torch.where(position < self.sinks, float(s) + position, position)  # sinks first, then recency
        return score.expand(b, h, s)
