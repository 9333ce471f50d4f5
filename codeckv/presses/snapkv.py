"""SnapKV (Li et al., 2024): the last queries of the prompt (an observation window) say which earlier tokens matter.

As kvpress 0.5.5's `kvpress/presses/snapkv_press.py` (SnapKVPress, window_size=64, kernel_size=5): the attention of
the window's queries over every key (softmax over all of them, each query seeing the keys up to its own position) is
averaged over those queries and, for the keys before the window, average-pooled over `kernel` neighbouring tokens per
query head, then averaged over the query heads of each KV head; the window's own tokens are always kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codeckv.presses.base import Press, Rope, grouped, kept_first, window_attention


@dataclass(frozen=True)
class SnapKVPress(Press):
    """Attention from the last `window` queries, average-pooled over `kernel` neighbouring tokens."""

    window: int = 64
    kernel: int = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("window", "kernel"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SnapKVPress: {name}={value!r} must be a whole number >= 1")
        if self.kernel % 2 == 0:
            raise ValueError(f"SnapKVPress: kernel={self.kernel} must be odd (a window centred on each token)")

    @property
    def queries_read(self) -> int:
        return self.window

    def scores(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor,
               rope: Rope | None = None) -> torch.Tensor:
        b, h, s, _ = keys.shape
        w = min(self.window, s - 1, queries.shape[2])  # kvpress needs more tokens than the window: a shorter chunk
        if w < 1:  # scores with the window that leaves one key before it
            return torch.ones(b, h, s, device=keys.device)
        attention = window_attention(keys, queries, w)[..., : s - w]  # (B, Hq, S - w): the keys before the window
        pooled = torch.nn.functional.avg_pool1d(attention, self.kernel, stride=1, padding=self.kernel // 2)
        return kept_first(grouped(pooled, h).mean(dim=2), after=w)
