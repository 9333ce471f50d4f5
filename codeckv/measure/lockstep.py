"""Distribution metrics, llama.cpp's yardstick: KL divergence, top-1 agreement and ΔNLL against native.

    reference = native_reference(model, windows)                       # the native pass, once
    scores = score_cache(model, reference, make_cache(config, "turbo-4"))  # the same tokens, the tier's cache
    stats = compare(reference, scores)                                  # means ± standard error over windows

Protocol (design.md): every window of T tokens prefills its first P (default T // 2), then the rest is
teacher-forced one token at a time through the cache, all windows of a run in one batch. The forward
of token t (P <= t < T - 1) predicts token t + 1, and at each of these T - 1 - P positions:

    nll   = -log p(token t+1)                                         (nats)
    kld   = KL(p_native || p_tier) = sum_v p_native(v) (log p_native(v) - log p_tier(v))   (nats)
    top1  = argmax p_tier == argmax p_native

The native log-probs are computed once and kept as (W, positions, vocab) fp32, so every tier is
compared with the same reference without re-running native. `on_step`, called after every forward,
is where a caller reports progress or stops the run (by raising).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import Cache, DynamicCache, PreTrainedModel

OnStep = Callable[[], None]


@dataclass
class Reference:
    """The native run over the windows: what every tier is compared with."""

    windows: torch.Tensor  # (W, T) token ids
    prefix: int  # P: tokens prefilled per window
    logprobs: torch.Tensor  # (W, positions, vocab) float32 native log-probs at the scored positions
    nll: torch.Tensor  # (W, positions) native -log p(target)

    @property
    def targets(self) -> torch.Tensor:
        """(W, positions) the scored tokens: window[P + 1:]."""
        return self.windows[:, self.prefix + 1 :]

    @property
    def positions(self) -> int:
        return self.nll.shape[1]


@dataclass
class Scores:
    """One cache fed the reference's tokens: its per-position metrics against native."""

    nll: torch.Tensor  # (W, positions)
    kld: torch.Tensor  # (W, positions) KL(native || this cache)
    top1: torch.Tensor  # (W, positions) bool, argmax agrees with native


@dataclass
class Spread:
    """A mean over every scored position and its standard error over windows (nan with one window)."""

    mean: float
    se: float


@dataclass
class Comparison:
    """A tier against native on the same windows (design.md metric definitions)."""

    nll_native: float
    nll: float
    delta_nll_pct: Spread  # 100 (NLL_tier - NLL_native) / NLL_native; se from the per-window values
    kld: Spread  # nats / token
    top1_pct: Spread  # % positions where both argmaxes agree


def _forward_logprobs(model: PreTrainedModel, ids: torch.Tensor, cache: Cache) -> torch.Tensor:
    """Feed ids (W, n) through the cache; log-probs of the last position (W, vocab) float32."""
    logits = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1].float()
    return torch.log_softmax(logits, dim=-1)


def _check(windows: torch.Tensor, prefix: int) -> None:
    if windows.dim() != 2 or windows.shape[1] < 4:
        raise ValueError(f"need (windows, tokens) ids with at least 4 tokens each, got shape {tuple(windows.shape)}")
    if not 1 <= prefix <= windows.shape[1] - 2:
        raise ValueError(f"prefix={prefix} must leave at least one scored position (1..{windows.shape[1] - 2})")


@torch.inference_mode()
def native_reference(
    model: PreTrainedModel, windows: torch.Tensor, prefix: int | None = None, on_step: OnStep | None = None
) -> Reference:
    """Run the windows (W, T) through a native DynamicCache and keep its log-probs at every scored position."""
    prefix = windows.shape[1] // 2 if prefix is None else prefix
    _check(windows, prefix)
    windows = windows.to(model.device)
    cache = DynamicCache(config=model.config)
    logprobs = []
    _forward_logprobs(model, windows[:, :prefix], cache)
    for t in range(prefix, windows.shape[1] - 1):
        logprobs.append(_forward_logprobs(model, windows[:, t : t + 1], cache).cpu())
        if on_step:
            on_step()
    logprobs = torch.stack(logprobs, dim=1)  # (W, positions, vocab)
    windows = windows.cpu()
    nll = -logprobs.gather(-1, windows[:, prefix + 1 :, None]).squeeze(-1)
    return Reference(windows, prefix, logprobs, nll)


@torch.inference_mode()
def score_cache(model: PreTrainedModel, reference: Reference, cache: Cache, on_step: OnStep | None = None) -> Scores:
    """Feed the reference's tokens through `cache` (fresh) and compare every prediction with native's."""
    windows = reference.windows.to(model.device)
    targets = reference.targets
    nll, kld, top1 = [], [], []
    _forward_logprobs(model, windows[:, : reference.prefix], cache)
    for i, t in enumerate(range(reference.prefix, windows.shape[1] - 1)):
        got = _forward_logprobs(model, windows[:, t : t + 1], cache).cpu()  # (W, vocab)
        want = reference.logprobs[:, i]
        nll.append(-got.gather(-1, targets[:, i : i + 1]).squeeze(-1))
        kld.append(kl_divergence(want, got))
        top1.append(got.argmax(-1) == want.argmax(-1))
        if on_step:
            on_step()
    return Scores(torch.stack(nll, 1), torch.stack(kld, 1), torch.stack(top1, 1))


def kl_divergence(native_logprobs: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    """KL(native || other) along the last axis, in nats; exactly 0 where the two are equal."""
    p = native_logprobs.exp()
    terms = torch.where(p > 0, p * (native_logprobs - logprobs), torch.zeros_like(p))
    return terms.sum(-1).clamp_min(0.0)


def spread(per_window: torch.Tensor) -> Spread:
    """Mean of per-window values and its standard error over the windows (nan for a single window)."""
    values = per_window.double()
    se = float(values.std(unbiased=True) / math.sqrt(values.numel())) if values.numel() > 1 else math.nan
    return Spread(float(values.mean()), se)


def delta_percent(tier_nll: float, native_nll: float) -> float:
    """ΔNLL% = 100 × (NLL_tier − NLL_native) / NLL_native (design.md)."""
    return 100.0 * (tier_nll - native_nll) / native_nll


def compare(reference: Reference, scores: Scores) -> Comparison:
    """Means over all scored positions; standard errors over the per-window means."""
    native_w, tier_w = reference.nll.mean(1), scores.nll.mean(1)  # (W,)
    nll_native, nll = float(reference.nll.mean()), float(scores.nll.mean())
    delta = spread(100.0 * (tier_w - native_w) / native_w)
    return Comparison(
        nll_native=nll_native,
        nll=nll,
        delta_nll_pct=Spread(delta_percent(nll, nll_native), delta.se),
        kld=spread(scores.kld.mean(1)),
        top1_pct=spread(100.0 * scores.top1.double().mean(1)),
    )
