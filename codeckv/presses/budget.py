"""A token budget: a press that keeps at most `tokens` per layer while the cache grows, decoding included (kvpress's
DecodingPress: compress every `interval` steps back to a target size).

A prefill chunk that leaves a layer holding more than `tokens` is pressed back to `tokens` at once; during decoding
the layer lets `interval` tokens pile up past the budget and then presses back to it, so the scoring runs once per
`interval` steps instead of at every one. Each time, the inner press scores every token the layer holds (not only
the newest chunk), with the queries of the layer's last tokens that the press reads (`queries_read`: SnapKV's and
expected attention's window of 64, TOVA's one, none for StreamingLLM and key norm), which the layer keeps for that
purpose (their bytes count in what it holds). A budget needs raw tokens to evict: it applies to a press alone, whose
kept tokens stay raw (a codec's archive cannot give a token back without re-coding its group).

    Budget(TOVAPress(), tokens=256)          # what the tier tova-budget256 holds
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codeckv.presses.base import Press, Rope

MAX_TOKENS = 1 << 20  # as the Advanced panel's window bounds


@dataclass(frozen=True)
class Budget(Press):
    """Keep at most `tokens` per layer: `press` scores every held token; decoding presses every `interval` steps."""

    press: Press | None = None
    tokens: int = 1024
    interval: int = 16
    ratio: float = 0.0  # a budget keeps a count, not a share

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.press, Press) or isinstance(self.press, Budget):
            raise ValueError(f"Budget: press={self.press!r} must be a press that scores tokens (allowed: e.g. "
                             "TOVAPress(), SnapKVPress(), StreamingLLMPress())")
        for name, low in (("tokens", 2), ("interval", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_TOKENS:
                raise ValueError(f"Budget: {name}={value!r} must be a whole number in {low}..{MAX_TOKENS}")

    @property
    def queries_read(self) -> int:
        return self.press.queries_read

    def scores(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor,
               rope: Rope | None = None) -> torch.Tensor:
        return self.press.scores(keys, values, queries, rope)

    def over(self, held: int, new: int) -> bool:
        """True when a layer holding `held` tokens after taking `new` should be pressed back to the budget."""
        return held > self.tokens + (0 if new > 1 else self.interval - 1)
