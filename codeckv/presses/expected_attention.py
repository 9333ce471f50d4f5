"""Expected attention (Devoto et al., 2025): the attention a key can expect from the queries still to come, times
how much its value would move the output.

As kvpress 0.5.5's `kvpress/presses/expected_attention_press.py` (ExpectedAttentionPress, n_future_positions=512,
n_sink=4, use_covariance=True, use_vnorm=True, epsilon=0): the coming queries of each query head are modelled as a
Gaussian whose mean mu and full D x D covariance Sigma are those of the prefill's queries before RoPE (less the first
`sinks`), carried to the next `future` positions by RoPE's rotation averaged over them (R). For a Gaussian query the
expected exponentiated score of key k is exp(k . R mu / sqrt(D) + k^T R Sigma R^T k / (2 D)); normalised over the
keys after the sinks, averaged over the query heads of each KV head and multiplied by the value's norm, it is the
token's score. The first `sinks` tokens are always kept (the attention sinks).

The queries reach a press after RoPE (codeckv's attention function sees them so); the press turns them back with
the model's own rotary embedding at their positions (Rope), which is exact up to rounding. A model without a rotary
embedding (absolute positions) has queries that never rotate: R is the identity. A model that rotates neighbouring
channels (Llama 4) has its queries and keys laid out as rotate_half pairs first (the same permutation of both: the
scores are dot products, which it leaves as they are).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from codeckv.presses.base import Press, Rope, grouped, kept_first


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """RoPE's pairing of channel i with channel i + R/2 (transformers' rotate_half)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _half_pairs(x: torch.Tensor) -> torch.Tensor:
    """Channels paired as neighbours (2i, 2i + 1) laid out as rotate_half pairs (i, i + D/2): evens, then odds."""
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)


def _before_rope(queries: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """(..., T, D) queries after RoPE back to before it: the first R channels rotated back by (cos, sin) (T, R),
    divided by cos^2 + sin^2 (an attention scaling folded into them); the others were never rotated."""
    r = cos.shape[-1]
    rotated = queries[..., :r]
    back = (rotated * cos - _rotate_half(rotated) * sin) / (cos * cos + sin * sin)
    return torch.cat([back, queries[..., r:]], dim=-1)


def _average_rotation(cos: torch.Tensor, sin: torch.Tensor, dim: int) -> torch.Tensor:
    """(D, D) RoPE's rotation matrix averaged over positions whose (cos, sin) are (P, R): on the first R channels
    diag(cos) + J diag(sin), J the rotate_half matrix; the identity on the others."""
    r = cos.shape[-1]
    half = torch.eye(r // 2, dtype=cos.dtype, device=cos.device)
    j = torch.zeros(r, r, dtype=cos.dtype, device=cos.device)
    j[r // 2 :, : r // 2], j[: r // 2, r // 2 :] = half, -half
    rotation = torch.eye(dim, dtype=cos.dtype, device=cos.device)
    rotation[:r, :r] = torch.diag_embed(cos).mean(0) + j @ torch.diag_embed(sin).mean(0)
    return rotation


@dataclass(frozen=True)
class ExpectedAttentionPress(Press):
    """Expected attention from a Gaussian model of the coming queries, weighted by value norm; `sinks` kept."""

    future: int = 512
    sinks: int = 4
    covariance: bool = True
    value_norm: bool = True
    epsilon: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, low in (("future", 1), ("sinks", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"ExpectedAttentionPress: {name}={value!r} must be a whole number >= {low}")
        if isinstance(self.epsilon, bool) or not isinstance(self.epsilon, float | int) or self.epsilon < 0:
            raise ValueError(f"ExpectedAttentionPress: epsilon={self.epsilon!r} must be a number >= 0")

    @property
    def queries_read(self) -> int:
        """Under a token budget the statistics are those of the last 64 queries it keeps (a prefill's own: all)."""
        return 64

    def query_statistics(self, queries: torch.Tensor, rope: Rope | None, whole: bool):
        """Mean (B, Hq, D) and covariance (B, Hq, D, D) of the coming queries, after the averaged rotation. `whole`:
        the queries are the prefill's own from its first token, whose first `sinks` are left out. The queries are
        laid out as rotate_half pairs (_half_pairs)."""
        q = queries.float()
        t, d = q.shape[2], q.shape[3]
        if rope is not None:
            cos, sin = rope.at(torch.arange(rope.future - t, rope.future, device=q.device))
            q = _before_rope(q, cos, sin)
        if whole and t > self.sinks:
            q = q[:, :, self.sinks :]
        mean = q.mean(dim=2)
        centred = q - mean[:, :, None]
        cov = torch.einsum("bhti,bhtj->bhij", centred, centred) / q.shape[2] if self.covariance else None
        if rope is None:
            return mean, cov
        cos, sin = rope.at(torch.arange(rope.future, rope.future + self.future, device=q.device))
        rotation = _average_rotation(cos, sin, d)
        mean = mean @ rotation.T
        return mean, (rotation @ cov @ rotation.T if cov is not None else None)

    def scores(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor,
               rope: Rope | None = None) -> torch.Tensor:
        b, h, s, d = keys.shape
        sinks = min(self.sinks, s - 1)
        if rope is not None and rope.interleaved:
            keys, queries = _half_pairs(keys), _half_pairs(queries)
        mean, cov = self.query_statistics(queries, rope, whole=queries.shape[2] == s)
        k = keys[:, :, sinks:].float()  # (B, H, S', D)
        logits = torch.einsum("bhgd,bhsd->bhgs", grouped(mean, h), k) / math.sqrt(d)
        if cov is not None:
            spread = torch.einsum("bhsd,bhgde->bhgse", k, grouped(cov, h))
            logits = logits + (spread * k[:, :, None]).sum(-1) / d / 2
        expected = torch.softmax(logits, dim=-1).mean(dim=2)  # (B, H, S')
        if self.value_norm:
            expected = (expected + self.epsilon) * values[:, :, sinks:].float().norm(dim=-1)
        return kept_first(expected, before=sinks)
