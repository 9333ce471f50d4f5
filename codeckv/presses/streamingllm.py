"""StreamingLLM (Xiao et al., 2023): keep the first tokens (attention sinks) and the most recent ones."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codeckv.presses.base import Press


@dataclass(frozen=True)
class StreamingLLMPress(Press):
    """Keep `sinks` first tokens and then the newest; evict the middle."""

    sinks: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.sinks, bool) or not isinstance(self.sinks, int) or self.sinks < 0:
            raise ValueError(f"StreamingLLMPress: sinks={self.sinks!r} must be a whole number >= 0")

    def scores(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        b, h, s, _ = keys.shape
        position = torch.arange(s, dtype=torch.float32, device=keys.device)
        score = torch.where(position < self.sinks, float(s) + position, position)  # sinks first, then recency
        return score.expand(b, h, s)
