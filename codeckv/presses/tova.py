"""TOVA (Oren et al., 2024): keep the tokens the newest query attends to most, averaged over the query heads of each
KV head; the newest token itself is kept (kvpress's TOVAPress, applied once to a prefill chunk)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codeckv.presses.base import Press, window_attention


@dataclass(frozen=True)
class TOVAPress(Press):
    """Attention of the last query."""

    @property
    def queries_read(self) -> int:
        return 1

    def scores(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        attention = window_attention(keys, queries, 1)  # (B, H, S)
        attention[..., -1] = float("inf")
        return attention
