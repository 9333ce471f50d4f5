"""Distribution metrics, llama.cpp's yardstick: KL divergence, top-1 agreement and ΔNLL against native.

    caches = [make_cache(config, "native"), make_cache(config, "turbo-4"), make_cache(config, "png")]
    reference, scores = lockstep(model, windows, caches)     # caches[0] (native) gives the reference
    stats = compare(reference, scores[1])                     # turbo-4: means ± standard error over windows
    _, more = lockstep(model, windows, [make_cache(config, "int8")], reference=reference)  # later, same reference

Protocol (design.md): every window of T tokens prefills its first P (default T // 2), then the rest is
teacher-forced one token at a time through the cache. The forward of token t (P <= t < T - 1)
predicts token t + 1, and at each of these T - 1 - P positions:

    nll   = -log p(token t+1)                                         (nats)
    kld   = KL(p_native || p_tier) = sum_v p_native(v) (log p_native(v) - log p_tier(v))   (nats)
    top1  = argmax p_tier == argmax p_native

All the caches of a call are fed together in lockstep: one forward per position for all of them (a
StackedCache, codeckv/cache/stacked.py). On a CPU a small model's decode step is bound by reading its
weights, so the 4 x 512 docstring run of 11 tiers took 117.7 s against 408 s tier by tier (README,
"Tiers and what they cost"). Attention runs per cache, so a cache's numbers are those of a run on its
own up to the rounding of the matrix products at another batch size (~1e-6 in log-probs), and a
lossless cache is bitwise its baseline when both are in the same call. Every codec cache is scored
archiving from its first complete unit (lockstep sets raw_until=0 on each): the scores measure the codec,
never a short context that the cache would hold raw (codeckv/cache/layers.py, "Raw until N"). The
reference log-probs are kept as (W, positions, vocab) fp32, so caches scored in a later call compare with
the same reference without re-running native. `on_step`, called after every forward, is where a caller
reports progress or stops the run (by raising).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import Cache, PreTrainedModel

from codeckv.cache import CodecCache
from codeckv.cache.attention import use_codec_attention
from codeckv.cache.stacked import StackedCache
from codeckv.loaded import ModelInfo

OnStep = Callable[[], None]
STACK_BYTES = 2 << 30  # caches fed in one batch hold at most about this much KV (stack_size)


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
    """Feed ids (B, n) through the cache; log-probs of the last position (B, vocab) float32."""
    logits = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1].float()
    return torch.log_softmax(logits, dim=-1)


def _check(windows: torch.Tensor, prefix: int) -> None:
    if windows.dim() != 2 or windows.shape[1] < 4:
        raise ValueError(f"need (windows, tokens) ids with at least 4 tokens each, got shape {tuple(windows.shape)}")
    if not 1 <= prefix <= windows.shape[1] - 2:
        raise ValueError(f"prefix={prefix} must leave at least one scored position (1..{windows.shape[1] - 2})")


@torch.inference_mode()
def lockstep(
    model: PreTrainedModel,
    windows: torch.Tensor,
    caches: list[Cache],
    prefix: int | None = None,
    reference: Reference | None = None,
    on_step: OnStep | None = None,
    prefill_chunk: int | None = None,
) -> tuple[Reference, list[Scores]]:
    """Feed the windows (W, T) through every (fresh) cache at once; the reference and each cache's Scores.

    Without `reference`, caches[0] is the baseline whose log-probs become the reference (pass a native
    cache, make_cache(config, "native"), to measure against native; its own Scores are then exactly 0).
    With one (from an earlier call on the same windows), every cache is compared with it.
    The model is routed through codeckv attention (codeckv.cache.attention; load_model has done it already).
    prefill_chunk: feed the prefix in chunks of this many tokens (a press's "chunked" protocol) instead of one forward.
    """
    if not caches:
        raise ValueError("give at least one cache (the native baseline first when there is no reference yet)")
    for cache in caches:
        if isinstance(cache, CodecCache):
            cache.set_raw_until(0)  # the codec itself, from its first unit (module docstring)
    if reference is not None:
        windows, prefix = reference.windows, reference.prefix
    prefix = windows.shape[1] // 2 if prefix is None else prefix
    _check(windows, prefix)
    use_codec_attention(model)
    rows = windows.shape[0]
    stacked = StackedCache(caches, rows)
    ids = windows.to(model.device).repeat(len(caches), 1)  # cache i owns rows [i W, (i + 1) W)
    targets = windows[:, prefix + 1 :].cpu()
    baseline, nll, kld, top1 = [], [], [], []  # per position: (caches, W)
    step = prefill_chunk or prefix
    for lo in range(0, prefix, step):
        _forward_logprobs(model, ids[:, lo : min(lo + step, prefix)], stacked)
    for i, t in enumerate(range(prefix, windows.shape[1] - 1)):
        got = _forward_logprobs(model, ids[:, t : t + 1], stacked).cpu().view(len(caches), rows, -1)
        want = got[0] if reference is None else reference.logprobs[:, i]  # (W, vocab)
        if reference is None:
            baseline.append(want.clone())  # a view of got[0] would keep every cache's log-probs of the step alive
        nll.append(-got.gather(-1, targets[None, :, i : i + 1].expand(len(caches), -1, -1)).squeeze(-1))
        kld.append(kl_divergence(want, got))  # want broadcasts over the caches: its exp is taken once
        top1.append(got.argmax(-1) == want.argmax(-1))
        if on_step:
            on_step()
    if reference is None:
        logprobs = torch.stack(baseline, dim=1)  # (W, positions, vocab)
        native_nll = -logprobs.gather(-1, targets[..., None]).squeeze(-1)
        reference = Reference(windows.cpu(), prefix, logprobs, native_nll)
    per_cache = [torch.stack(values, dim=2) for values in (nll, kld, top1)]  # (caches, W, positions)
    return reference, [Scores(*(values[index] for values in per_cache)) for index in range(len(caches))]


def stack_size(info: ModelInfo, windows: int, tokens: int, budget: int = STACK_BYTES) -> int:
    """How many caches of `windows` rows x `tokens` tokens one lockstep call may feed together (at least 1).

    Counted as raw KV of every attention layer in the model's dtype, twice (a decoded view grows ahead
    of its tokens; a DynamicCache copies itself on every step): an upper bound for every tier.
    """
    element = torch.empty((), dtype=getattr(torch, info.dtype)).element_size()
    per_token = len(info.layer_types) * info.num_kv_heads * 2 * info.head_dim * element  # K and V, every layer
    return max(1, budget // (2 * windows * tokens * per_token))


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
