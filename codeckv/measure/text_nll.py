"""Native vs one tier on the embedded corpus or on any text: decode NLL, ΔNLL% and per-token NLL.

    cmp = compare_nll(loaded, "turbo-4")                    # the first corpus window of 256 tokens
    cmp = compare_nll(loaded, "turbo-4", text=user_text)    # any text, its first `length` tokens
    cmp.delta_nll_pct, cmp.token_delta                      # mean ΔNLL%, (positions,) codec - native

Both runs use the decode-NLL protocol of measure/nll.py on the same windows, so the
per-token difference shows where in the text the codec hurts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codeckv.cache import make_cache
from codeckv.measure.corpus import corpus_windows
from codeckv.measure.nll import NLLResult, decode_nll, delta_percent
from codeckv.models import LoadedModel
from codeckv.tiers import Tier, as_tier, get_tier


@dataclass
class NLLComparison:
    """Per-token NLL of the same scored tokens through a native cache and through the tier's cache."""

    tier: str
    source: str  # "corpus" or "text"
    native: NLLResult  # token_nll (positions,), windows concatenated
    codec: NLLResult  # (positions,)
    tokens: list[str]  # (positions,) the scored tokens, as text

    @property
    def delta_nll_pct(self) -> float:
        return delta_percent(self.codec.mean, self.native.mean)

    @property
    def token_delta(self) -> torch.Tensor:
        """(positions,) codec NLL - native NLL, nats: positive where the codec hurts."""
        return self.codec.token_nll - self.native.token_nll

    def summary(self) -> dict:
        return {
            "tier": self.tier,
            "source": self.source,
            "positions": self.native.token_nll.numel(),
            "nll_native": self.native.mean,
            "nll_codec": self.codec.mean,
            "delta_nll_pct": self.delta_nll_pct,
        }


def text_windows(loaded: LoadedModel, text: str | None, windows: int = 1, length: int = 256) -> torch.Tensor:
    """(windows, length) corpus windows when text is None, else (1, <= length) ids of the text's start."""
    if text is None:
        return corpus_windows(loaded.tokenizer, windows, length)
    ids = loaded.tokenizer(text, return_tensors="pt").input_ids[0, :length]
    if ids.numel() < 4:
        raise ValueError(f"the text has {ids.numel()} tokens; NLL needs at least 4")
    return ids[None]


def compare_nll(
    loaded: LoadedModel, tier: Tier | str, text: str | None = None, windows: int = 1, length: int = 256
) -> NLLComparison:
    """Decode NLL of `text` (or of the corpus) through a native cache and through `tier`'s cache."""
    tier = as_tier(tier)
    data = text_windows(loaded, text, windows, length)  # (W, T)
    runs = {}
    for side, side_tier in (("native", get_tier("native")), ("codec", tier)):
        results = [decode_nll(loaded.model, w, lambda t=side_tier: make_cache(loaded.model.config, t)) for w in data]
        runs[side] = NLLResult(torch.cat([r.token_nll for r in results]), torch.cat([r.targets for r in results]))
    tokens = [loaded.tokenizer.decode([t]) for t in runs["native"].targets.tolist()]
    return NLLComparison(tier.name, "corpus" if text is None else "text", runs["native"], runs["codec"], tokens)
