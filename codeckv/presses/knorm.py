"""Key norm (Devoto et al., 2024): a key of small L2 norm tends to draw much attention; keep those, evict the largest.

As kvpress 0.5.5's `kvpress/presses/knorm_press.py` (KnormPress): the negated L2 norm of each key, in float32. Needs
no query: it scores the keys alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codeckv.presses.base import Press, Rope


@dataclass(frozen=True)
class KnormPress(Press):
    """Keep the keys of smallest norm."""

    def scores(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor,
               rope: Rope | None = None) -> torch.Tensor:
        return -keys.float().norm(dim=-1)
