"""Decode NLL (design.md): prefill half a window, then teacher-force the rest one token at a time.

The second half goes through the cache exactly as generation would, so a codec's
archived blocks are what the later tokens attend to. Returns per-token NLL as well,
so a chart can show where a codec hurts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import Cache, PreTrainedModel


@dataclass
class NLLResult:
    """Mean NLL and the per-token values, in nats, for the teacher-forced positions."""

    token_nll: torch.Tensor  # (positions,) fp32, -log p(token t+1 | tokens <= t)
    targets: torch.Tensor  # (positions,) the scored token ids

    @property
    def mean(self) -> float:
        return float(self.token_nll.mean())


@torch.inference_mode()
def decode_nll(
    model: PreTrainedModel, window: torch.Tensor, make_cache: Callable[[], Cache], prefix: int | None = None
) -> NLLResult:
    """NLL of window[P+1:] predicted step by step after prefilling window[:P], P = len // 2. window: (T,).

    Works on any token sequence: a corpus window or a user's text. `prefix` overrides P,
    e.g. the prompt length when scoring a generated turn (measure/side_by_side.py).
    """
    if window.numel() < 4:
        raise ValueError(f"need at least 4 tokens to measure NLL, got {window.numel()}")
    window = window.to(model.device)
    prefix = window.shape[0] // 2 if prefix is None else prefix
    if not 1 <= prefix <= window.shape[0] - 2:
        raise ValueError(f"prefix={prefix} must leave at least one scored token (1..{window.shape[0] - 2})")
    cache = make_cache()
    model(input_ids=window[None, :prefix], cache=cache, use_cache=True)
    nll = []
    for t in range(prefix, window.shape[0] - 1):
        logits = model(input_ids=window[None, t : t + 1], cache=cache, use_cache=True).logits[0, -1].float()
        nll.append(torch.log_softmax(logits, dim=-1)[window[t + 1]].neg())
    return NLLResult(torch.stack(nll).cpu(), window[prefix + 1 :].cpu())


def delta_percent(tier_nll: float, native_nll: float) -> float:
    """ΔNLL% = 100 × (NLL_tier − NLL_native) / NLL_native (design.md)."""
    return 100.0 * (tier_nll - native_nll) / native_nll
