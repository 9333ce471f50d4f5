"""Prefill cost of archiving: native prefill vs prefill + archiving the prompt, per tier (python -m codeckv prefill).

For each prompt length (the first N corpus tokens) and each tier, repeated `reps` times and interleaved
in one process, so that every tier's ratio compares runs made at the same moment:

    native     model(ids, cache=DynamicCache)                                     SDPA on the raw tokens
    prefill    model(ids, cache=make_cache(tier)); cache.flush()                   what the app times
    convert    model(ids, cache=DynamicCache); CodecCache.from_cache(cache, tier)  the long-prompt fast path

Reported: the median seconds of each, and prefill / native, convert / native from the medians of the
native runs made next to that tier's.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from codeckv.cache import CodecCache, make_cache
from codeckv.cache.calibration import calibration_for
from codeckv.corpus import corpus_windows
from codeckv.loaded import LoadedModel
from codeckv.tiers import Tier


@dataclass
class PrefillRow:
    """One tier at one prompt length: median seconds and ratios to the native prefill."""

    tier: str
    tokens: int
    native_s: float
    prefill_s: float  # prefill through the codec cache, then flush (archiving the prompt)
    ratio: float  # prefill_s / native_s
    convert_s: float | None  # native prefill, then CodecCache.from_cache (None when not measured)
    convert_ratio: float | None
    reps: int
    threads: int


def _seconds(run: Callable[..., object], *args) -> float:
    start = time.perf_counter()
    run(*args)
    seconds = time.perf_counter() - start
    gc.collect()
    return seconds


@torch.inference_mode()
def prefill_table(
    loaded: LoadedModel,
    tiers: list[Tier],
    lengths: list[int],
    reps: int = 3,
    convert: bool = True,
    progress: Callable[[str], None] | None = None,
) -> list[PrefillRow]:
    """Time native / prefill + flush / native + from_cache for every tier and prompt length (module docstring)."""
    model, config = loaded.model, loaded.model.config
    tiers = [t for t in tiers if not t.is_native]
    for tier in tiers:  # a PCA tier's calibration is read (or computed) now, outside the timings
        calibration_for(loaded, tier)

    def native(ids: torch.Tensor) -> DynamicCache:
        cache = DynamicCache(config=config)
        model(ids, cache=cache)
        return cache

    def through(ids: torch.Tensor, tier: Tier) -> None:
        cache = make_cache(loaded, tier)
        model(ids, cache=cache)
        cache.flush()

    def converted(ids: torch.Tensor, tier: Tier) -> CodecCache:
        return CodecCache.from_cache(native(ids), tier, calibration=calibration_for(loaded, tier))

    rows = []
    for length in lengths:
        ids = corpus_windows(loaded.tokenizer, 1, length)
        for tier in tiers:  # warm-up: lazily built tables, first-call allocations
            through(ids[:, :64], tier)
            converted(ids[:, :64], tier)
        times: dict[str, dict[str, list[float]]] = {t.name: {"native": [], "prefill": [], "convert": []} for t in tiers}
        for rep in range(reps):
            for tier in tiers:
                runs = times[tier.name]
                runs["native"].append(_seconds(native, ids))
                runs["prefill"].append(_seconds(through, ids, tier))
                if convert:
                    runs["convert"].append(_seconds(converted, ids, tier))
                if progress:
                    progress(f"{length} tokens, rep {rep + 1}/{reps}: {tier.name}")
        for tier in tiers:
            runs = times[tier.name]
            base = statistics.median(runs["native"])
            prefill = statistics.median(runs["prefill"])
            convert_s = statistics.median(runs["convert"]) if convert else None
            rows.append(PrefillRow(
                tier=tier.name, tokens=length, native_s=base, prefill_s=prefill, ratio=prefill / base,
                convert_s=convert_s, convert_ratio=None if convert_s is None else convert_s / base,
                reps=reps, threads=torch.get_num_threads(),
            ))
    return rows
