"""TOVA (Oren et al., 2024): keep the tokens the newest query attends to most.

As kvpress 0.5.5's `kvpress/presses/tova_press.py` (TOVAPress): the last query's attention over every key, averaged
over all the layer's query heads, so that every KV head keeps the same positions; the newest token itself is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codeckv.presses.base import Press, Rope, kept_first, window_attention


@dataclass(frozen=True)
class TOVAPress(Press):
    """Attention of the last query, averaged over all query heads: one kept set for the layer."""

    @property
    def queries_read(self) -> int:
        return 1

    def scores(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor,
               rope: Rope | None = None) -> torch.Tensor:
        b, h, s, _ = keys.shape
        attention = window_attention(keys, queries, 1)[..., : s - 1]  # (B, Hq, S - 1)
        shared = attention.mean(dim=1, keepdim=True).expand(b, h, s - 1)  # every KV head alike
        return kept_first(shared, after=1)
