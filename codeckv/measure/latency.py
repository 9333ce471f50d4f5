"""Decode latency of tiers against native, with and without a decoded view (python -m codeckv latency).

Each (tier, view) pair is one run_side_by_side on the same prompt: the native cache and the codec cache
generate in turns, token by token, so each row's native and codec medians come from the same moments.
materialization_free=True keeps no decoded view: attention reads the stored codes (Triton on CUDA).
"""

from __future__ import annotations

from collections.abc import Callable

from codeckv.measure.side_by_side import Prompt, prompt_ids, run_side_by_side
from codeckv.models import LoadedModel
from codeckv.tiers import Tier, as_tier


def latency_table(
    loaded: LoadedModel,
    prompt: Prompt,
    tiers: list[str | Tier],
    max_new_tokens: int = 64,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """One row per tier and view: decode ms/token native vs codec, their ratio, prefill, match, ΔNLL, bytes."""
    rows = []
    prompt_tokens = prompt_ids(loaded, prompt, max_new_tokens).shape[1]
    for tier in (as_tier(t) for t in tiers):
        for materialization_free in (False, True):
            result = run_side_by_side(loaded, prompt, tier, max_new_tokens, stop_at_eos=False,
                                      materialization_free=materialization_free)
            rows.append({
                "tier": tier.name,
                "materialization_free": materialization_free,
                "device": loaded.info.device,
                "dtype": loaded.info.dtype,
                "prompt_tokens": prompt_tokens,
                "new_tokens": len(result.native.token_ids),
                "native_decode_ms": result.native.decode_ms,
                "decode_ms": result.codec.decode_ms,
                "latency_ratio": result.latency_ratio,
                "native_prefill_s": result.native.prefill_s,
                "prefill_s": result.codec.prefill_s,
                "token_match": result.token_match,
                "delta_nll_pct": result.delta_nll_pct,
                "ratio_vs_bf16": result.ratio_vs_bf16,
                "resident_bytes": result.codec.resident_bytes,
                "archive_bytes": result.codec.archive_bytes,
            })
            if progress:
                progress(f"{tier.name}{' materialization-free' if materialization_free else ''}")
    return rows
