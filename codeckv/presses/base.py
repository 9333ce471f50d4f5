"""What a press is: it scores a layer's tokens per KV head, and the layer keeps the best (1 - ratio) of them.

    keep = keep_indices(SnapKVPress(ratio=0.5), keys, values, queries)   # (B, H, k) sorted positions kept
    layer.press(queries)          # codeckv/cache/layers.py: evicts the others, frees their bytes

A press acts when a layer takes a prefill chunk (more than one new token): after that chunk's attention (which
saw every token, as kvpress's presses do), it scores the chunk's new tokens and the layer drops the lowest
`ratio` of them in each KV head, so every chunk of a chunked prefill is compressed as it arrives (kvpress's
ChunkPress); decode steps keep their tokens. A tier composes a press with a codec: the press picks the tokens, the
codec stores the kept ones (codeckv/tiers.py).

A press is a frozen dataclass whose fields are its parameters (validated in __post_init__); `scores(keys, values,
queries)` returns (B, H, S) float32, higher kept first:

    keys, values   (B, H, S, D) the chunk's new keys (RoPE applied) and values, per KV head
    queries        (B, Hq, S, D) the chunk's queries (RoPE applied), Hq = H x G query heads per KV head (GQA)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

RATIOS = (0.25, 0.5, 0.75, 0.875)  # the shares evicted the presets use; any 0 <= ratio < 1 is allowed


@dataclass(frozen=True)
class Press:
    """Evict `ratio` of each prefill chunk's tokens (module docstring); subclasses score them."""

    ratio: float = 0.5

    def __post_init__(self) -> None:
        if isinstance(self.ratio, bool) or not isinstance(self.ratio, float | int) or not 0 <= self.ratio < 1:
            raise ValueError(f"{type(self).__name__}: ratio={self.ratio!r} must be a share evicted in [0, 1) "
                             f"(e.g. {', '.join(map(str, RATIOS))})")

    @property
    def queries_read(self) -> int:
        """How many of the last queries `scores` reads (0: none, it scores the keys alone); a budget keeps that many."""
        return 0

    def scores(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def kept_count(tokens: int, ratio: float) -> int:
    """Tokens a chunk of `tokens` keeps at `ratio` evicted: the rest rounded up, and at least one."""
    return max(1, math.ceil(tokens * (1 - ratio) - 1e-9))


def keep_indices(press: Press, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor,
                 keep: int | None = None) -> torch.Tensor:
    """(B, H, k) positions of the chunk each KV head keeps, in order (the press's top k scores); k = `keep` when
    given (a token budget, presses/budget.py), else what the press's ratio leaves."""
    k = kept_count(keys.shape[2], press.ratio) if keep is None else min(keep, keys.shape[2])
    scores = press.scores(keys, values, queries)  # (B, H, S)
    return scores.topk(k, dim=-1).indices.sort(dim=-1).values


def grouped_queries(queries: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, Hq, T, D) queries as (B, H, G, T, D): the G query heads of each KV head together (GQA)."""
    b, hq, t, d = queries.shape
    return queries.reshape(b, heads, hq // heads, t, d)


def window_attention(keys: torch.Tensor, queries: torch.Tensor, window: int) -> torch.Tensor:
    """The attention of the last `window` queries over the keys, averaged over those queries and the query heads of
    each KV head: (B, H, S) float32. The queries are those of the last keys (a chunk's own, or the decode steps a
    budget kept: fewer than S), each seeing the keys up to its own position."""
    b, h, s, d = keys.shape
    w = min(window, s, queries.shape[2])
    q = grouped_queries(queries[:, :, queries.shape[2] - w :], h).float()  # (B, H, G, w, D)
    logits = torch.einsum("bhgwd,bhsd->bhgws", q, keys.float()) / math.sqrt(d)
    visible = torch.arange(s, device=keys.device)[None, :] <= torch.arange(s - w, s, device=keys.device)[:, None]
    weights = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
    return weights.mean(dim=(2, 3))
