"""Expected attention (Devoto et al., 2025, kvpress's strongest at high ratios): the attention a key can expect from
the queries still to come, times how much its value would move the output.

The coming queries are modelled as Gaussian, per query head: mean mu and per-channel variance sigma^2 of the chunk's
last `window` queries (RoPE applied: a query's statistics at the next positions, which kvpress averages over future
rotations, are taken as those of the latest ones). For a Gaussian query the expected exponentiated score of key k is
exp(mu . k / sqrt(D) + k^T diag(sigma^2) k / (2 D)); normalised over the chunk's keys, averaged over the query heads of
each KV head, and multiplied by the value's norm, it is the token's score. The window's own tokens are kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from codeckv.presses.base import Press, grouped_queries


@dataclass(frozen=True)
class ExpectedAttentionPress(Press):
    """Expected attention from a Gaussian model of the next queries, weighted by value norm."""

    window: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 2:
            raise ValueError(f"ExpectedAttentionPress: window={self.window!r} must be a whole number >= 2")

    @property
    def queries_read(self) -> int:
        return self.window

    def scores(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        b, h, s, d = keys.shape
        w = min(self.window, s, queries.shape[2])  # the queries of the last keys (window_attention)
        q = grouped_queries(queries[:, :, queries.shape[2] - w :], h).float()  # (B, H, G, w, D)
        mean, var = q.mean(dim=3), q.var(dim=3, unbiased=False) if w > 1 else torch.zeros_like(q[:, :, :, 0])
        k = keys.float()
        logits = torch.einsum("bhgd,bhsd->bhgs", mean, k) / math.sqrt(d)
        logits = logits + torch.einsum("bhgd,bhsd->bhgs", var, k * k) / (2 * d)
        expected = torch.softmax(logits, dim=-1).mean(dim=2)  # (B, H, S)
        score = expected * values.float().norm(dim=-1)
        window = torch.arange(s, device=keys.device) >= s - w
        return torch.where(window, float("inf"), score)
