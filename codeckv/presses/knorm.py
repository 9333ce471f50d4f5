"""Key norm (Devoto et al., 2024): a key of small L2 norm tends to draw much attention; keep those, evict the largest.

Needs no query: it scores the keys alone (kvpress's KnormPress).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codeckv.presses.base import Press


@dataclass(frozen=True)
class KnormPress(Press):
    """Keep the keys of smallest norm."""

    def scores(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        return -keys.float().norm(dim=-1)
