"""What a press is: it scores a layer's tokens per KV head, and the layer keeps the best (1 - ratio) of them.

    keep = keep_indices(SnapKVPress(ratio=0.5), keys, values, queries)   # (B, H, k) sorted positions kept
    layer.press(queries)          # codeckv/cache/layers.py: evicts the others, frees their bytes

Each press named after a published method keeps the tokens kvpress 0.5.5's press of that name keeps, with its
default parameters (its docstring cites the kvpress file it follows; tests/presses/test_kvpress_reference.py checks
the kept positions against kvpress's own, recorded by scripts/kvpress_reference.py).

When a press acts is the cache's protocol (PRESS_MODES, make_cache(..., press_mode=...)):
- "once" (kvpress's default, and this project's): the context's prefill, the first forward into an empty cache, is
  pressed after its attention (which saw every token); what follows, a question or the decoded answer, is not.
- "chunked" (kvpress's ChunkPress): every prefill chunk (more than one new token) is pressed as it arrives, so a
  long prompt fed in chunks never holds more than a chunk beyond what was kept: the memory-bounded streaming mode.
Decode steps are never pressed, except by a token budget (presses/budget.py). A tier composes a press with a codec:
the press picks the tokens, the codec stores the kept ones (codeckv/tiers.py).

A press is a frozen dataclass whose fields are its parameters (validated in __post_init__); `scores(keys, values,
queries, rope)` returns (B, H, S) float32, higher kept first:

    keys, values   (B, H, S, D) the chunk's keys (RoPE applied) and values, per KV head
    queries        (B, Hq, T, D) the queries of the chunk's last T tokens (RoPE applied), Hq = H x G (GQA)
    rope           the model's rotary embedding at the chunk's positions (Rope), for a press that needs the queries
                   before RoPE (expected attention); None where the model has no rotary embedding
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

RATIOS = (0.25, 0.5, 0.75, 0.875)  # the shares evicted kvpress's leaderboard reports; any 0 <= ratio < 1 is allowed
PRESS_MODES = ("once", "chunked")  # when a press acts (module docstring); "once" is the default
PRESS_MODE_MEANING = {  # each protocol in a line, as the CLI's help and output and the app's Needle tab say it
    "once": "the context pressed once after its prefill, what follows not (kvpress's protocol)",
    "chunked": "every prefill chunk pressed as it arrives (memory-bounded streaming)",
}


def check_press_mode(mode: str) -> str:
    """`mode` if it is one of PRESS_MODES, else a ValueError listing them."""
    if mode not in PRESS_MODES:
        raise ValueError(f"press_mode={mode!r} is not a press protocol (allowed: {', '.join(PRESS_MODES)})")
    return mode


@dataclass(frozen=True)
class Rope:
    """The model's rotary embedding, seen from a layer being pressed: `at(positions)` gives (cos, sin), each (P, R)
    float32, as the model applies them to the first R channels of a head (rotate_half convention; the others are not
    rotated); `future` is the position the next token will take (the queries given are those just before it);
    `interleaved`: the model pairs neighbouring channels (2i, 2i + 1) instead (Llama 4), (cos, sin) laid out as
    for rotate_half."""

    at: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    future: int
    interleaved: bool = False


@dataclass(frozen=True)
class Press:
    """Evict `ratio` of a prefill's tokens (module docstring); subclasses score them."""

    ratio: float = 0.5

    def __post_init__(self) -> None:
        if isinstance(self.ratio, bool) or not isinstance(self.ratio, float | int) or not 0 <= self.ratio < 1:
            raise ValueError(f"{type(self).__name__}: ratio={self.ratio!r} must be a share evicted in [0, 1) "
                             f"(e.g. {', '.join(map(str, RATIOS))})")

    @property
    def queries_read(self) -> int:
        """How many of the last queries `scores` reads (0: none, it scores the keys alone); a budget keeps that many."""
        return 0

    def scores(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor,
               rope: Rope | None = None) -> torch.Tensor:
        raise NotImplementedError


def kept_count(tokens: int, ratio: float) -> int:
    """Tokens a prefill of `tokens` keeps at `ratio` evicted: the rest rounded down, and at least one (kvpress's
    utils.compute_n_kept)."""
    return max(1, int(tokens * (1 - ratio)))


def keep_indices(press: Press, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor,
                 keep: int | None = None, rope: Rope | None = None) -> torch.Tensor:
    """(B, H, k) positions of the chunk each KV head keeps, in order (the press's top k scores); k = `keep` when
    given (a token budget, presses/budget.py), else what the press's ratio leaves."""
    k = kept_count(keys.shape[2], press.ratio) if keep is None else min(keep, keys.shape[2])
    scores = press.scores(keys, values, queries, rope)  # (B, H, S)
    return scores.topk(k, dim=-1).indices.sort(dim=-1).values


def grouped(per_query_head: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, Hq, ...) as (B, H, G, ...): the G query heads of each KV head together (GQA)."""
    return per_query_head.reshape(per_query_head.shape[0], heads, -1, *per_query_head.shape[2:])


def window_attention(keys: torch.Tensor, queries: torch.Tensor, window: int) -> torch.Tensor:
    """The attention of the last `window` queries over all S keys, each query seeing the keys up to its own position,
    softmax over the S keys, then averaged over those queries: (B, Hq, S) float32, per query head. The queries are
    those of the last keys (a chunk's own, or the decode steps a budget kept: fewer than S)."""
    b, h, s, d = keys.shape
    w = min(window, s, queries.shape[2])
    q = grouped(queries[:, :, queries.shape[2] - w :], h).float()  # (B, H, G, w, D)
    logits = torch.einsum("bhgwd,bhsd->bhgws", q, keys.float()) / math.sqrt(d)
    visible = torch.arange(s, device=keys.device)[None, :] <= torch.arange(s - w, s, device=keys.device)[:, None]
    weights = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)  # (B, H, G, w, S)
    return weights.mean(dim=3).reshape(b, -1, s)


def kept_first(scores: torch.Tensor, before: int = 0, after: int = 0) -> torch.Tensor:
    """Scores (B, H, n) with `before` leading and `after` trailing positions added at the highest score plus one, so
    that they are always kept (kvpress pads its windows and sinks so)."""
    top = float(scores.max()) + 1 if scores.numel() else 1.0
    return torch.nn.functional.pad(scores, (before, after), value=top)
