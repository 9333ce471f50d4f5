"""SnapKV (Li et al., 2024): the last queries of the prompt (an observation window) say which earlier tokens matter.

Each token scores the attention it gets from the window's queries, averaged over them and over the query heads of its
KV head, then max-pooled over neighbouring tokens (kernel 5: a kept token brings its neighbours); the window's own
tokens are always kept, as kvpress's SnapKVPress does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codeckv.presses.base import Press, window_attention


@dataclass(frozen=True)
class SnapKVPress(Press):
    """Attention from the last `window` queries, pooled over `kernel` neighbouring tokens."""

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

    def scores(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        s = keys.shape[2]
        attention = window_attention(keys, queries, self.window)  # (B, H, S)
        pooled = torch.nn.functional.max_pool1d(attention, self.kernel, stride=1, padding=self.kernel // 2)
        window = torch.arange(s, device=keys.device) >= s - min(self.window, s)
        return torch.where(window, float("inf"), pooled)
