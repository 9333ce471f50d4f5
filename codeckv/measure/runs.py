"""What a side-by-side turn reports: each run's panel while it streams, its stats, and its comparison with native.

    update.panels["turbo-4"].text      # Panel: what a run has generated so far
    update.result.kld                  # Comparison (final update): bytes, latency, token match, KLD / top-1 / ΔNLL
    update.result.codec.footprint      # RunStats: a run's timings and the Footprint of its cache
    update.result.codec.raw_until      # [(N, codec layers)]: tokens held raw before archiving (cache/layers.py)

Pure data, filled by measure/side_by_side.py; formatting.py and plots.py read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from codeckv.cache import CODES, SHORT_VIEW, VIEW, CodecCache
from codeckv.cache.footprint import Footprint

NATIVE = "native"  # label of the reference run
Prompt = str | list[dict] | torch.Tensor  # raw text, chat messages [{"role": ..., "content": ...}], or (1, T) ids

MODES = (CODES, SHORT_VIEW, VIEW)  # where a codec layer's attention reads its archive (codeckv.cache.CodecCache)

PEAK_SOURCE = {
    "cuda": "cuda max_memory_allocated during the run's forwards (process-wide: weights, all caches, activations)",
    "cpu": "the most the cache's own tensors held after any forward of the turn (CPU: exact tensor bytes, "
           "archive, raw tokens, view and slack; activations and transient buffers not counted)",
}


@dataclass
class Panel:
    """What one run has generated so far."""

    label: str  # "native" or a tier name
    token_ids: list[int]
    text: str  # decoded without special tokens
    done: bool  # stopped at a stop token or at max_new_tokens


@dataclass
class RunStats:
    """One finished run of a turn: its tokens, its latency and the bytes its cache holds at the end."""

    label: str
    token_ids: list[int]
    text: str
    prompt_tokens: int  # tokens prefilled this turn (the whole prompt on a first turn)
    prefill_s: float  # the prompt's forwards plus archiving it
    decode_ms: float  # median ms per decode step after one warm-up step (nan with fewer than 2 decode steps)
    decode_ms_mean: float  # mean of the same steps: includes the periodic block-archiving steps the median hides
    tokens_per_s: float  # generated tokens / wall seconds of all its forwards, prefill included
    step_ms: list[float]  # every forward, prefill first
    footprint: Footprint  # the cache at the end of the turn (holding the conversation so far)
    held_bytes: int  # every tensor the cache owns at the end of the turn (design.md "held"), native layers too
    peak_held_bytes: int  # the most those tensors took after any forward of the turn
    peak_memory_bytes: int
    peak_memory_source: str  # what peak_memory_bytes measures (PEAK_SOURCE)
    attention: dict[str, int] = field(default_factory=dict)  # codec layers per attention mode ({}: a native cache)
    view_reason: str | None = None  # why some layers read a decoded view (None where none does)
    prefill_path: str = "native"  # how the prompt went into the cache
    raw_until: list[tuple[int | None, int]] = field(default_factory=list)  # raw_until_counts ([]: a native cache)

    @property
    def archive_bytes(self) -> int:
        """Full-attention layers: what the cache must keep (a native cache: what it holds)."""
        return self.footprint.archive_bytes

    @property
    def resident_bytes(self) -> int:
        """Full-attention layers: archive + materialized view + capacity slack."""
        return self.footprint.resident_bytes

    @property
    def bf16_bytes(self) -> int:
        """A bf16 native cache of the same tokens (the reference of every ratio)."""
        return self.footprint.bf16_bytes

    @property
    def native_layer_bytes(self) -> int:
        """Sliding-window / linear layers, which always stay native."""
        return self.footprint.native_layer_bytes


@dataclass
class Comparison:
    """A codec run against the native run of the same turn."""

    tier: str
    description: str
    native: RunStats
    codec: RunStats
    token_match: float  # fraction of the native run's positions where the codec emitted the same token
    first_divergence: int | None  # first position where they differ (or one has stopped), None if identical
    latency_ratio: float  # codec decode_ms / native decode_ms
    ratio_vs_bf16: float  # codec archive bytes / bf16 bytes of the same tokens, at the end of the turn
    steady_state_ratio: float  # bytes per archived token / bf16 bytes per token (nan if nothing archived)
    kld: float  # mean KL(native || codec) over the native reply's positions, nats per token
    top1_pct: float  # % of those positions where both caches put the same token first
    nll_native: float  # mean NLL of the native reply through the native cache
    nll_codec: float  # ... through the codec cache
    delta_nll_pct: float
    token_kld: list[float] = field(default_factory=list)  # (n,) per reply position
    token_nll_native: list[float] = field(default_factory=list)  # (n,)
    token_nll_codec: list[float] = field(default_factory=list)  # (n,)
    scored_tokens: list[str] = field(default_factory=list)  # (n,) the native reply's tokens, as text
    # along the codec's own reply (native fed the codec's tokens, measure/follower.py); nan unless asked
    own_kld: float = math.nan  # mean KL(native || codec) over the codec reply's positions, nats per token
    own_top1_pct: float = math.nan
    own_token_kld: list[float] = field(default_factory=list)  # (m,) per position of the codec's own reply

    def summary(self) -> dict:
        """One flat row: the numbers a table or a JSON report shows."""
        fp = self.codec.footprint
        return {
            "tier": self.tier,
            "archive_bytes": self.codec.archive_bytes,
            "resident_bytes": self.codec.resident_bytes,
            "bf16_bytes": self.codec.bf16_bytes,
            "native_bytes": self.native.archive_bytes,
            "ratio_vs_bf16": self.ratio_vs_bf16,
            "steady_state_ratio": self.steady_state_ratio,
            "archived_tokens": fp.archived_tokens,
            "raw_tokens": fp.sink_tokens + fp.window_tokens + fp.tail_tokens,
            "kld": self.kld,
            "top1_pct": self.top1_pct,
            "nll_native": self.nll_native,
            "nll_codec": self.nll_codec,
            "delta_nll_pct": self.delta_nll_pct,
            "prefill_s": self.codec.prefill_s,
            "native_prefill_s": self.native.prefill_s,
            "decode_ms": self.codec.decode_ms,
            "native_decode_ms": self.native.decode_ms,
            "decode_ms_mean": self.codec.decode_ms_mean,
            "native_decode_ms_mean": self.native.decode_ms_mean,
            "latency_ratio": self.latency_ratio,
            "tokens_per_s": self.codec.tokens_per_s,
            "native_tokens_per_s": self.native.tokens_per_s,
            "token_match": self.token_match,
            "first_divergence": self.first_divergence,
            "tokens": len(self.codec.token_ids),
            "held_bytes": self.codec.held_bytes,
            "native_held_bytes": self.native.held_bytes,
            "peak_held_bytes": self.codec.peak_held_bytes,
            "native_peak_held_bytes": self.native.peak_held_bytes,
            "attention": self.codec.attention,
            "raw_until": self.codec.raw_until,
            "prefill_path": self.codec.prefill_path,
            "peak_memory_bytes": self.codec.peak_memory_bytes,
            "native_peak_memory_bytes": self.native.peak_memory_bytes,
            "peak_memory_source": self.codec.peak_memory_source,
        }


@dataclass
class Update:
    """One streamed state: every panel so far; `results` only on the final update."""

    panels: dict[str, Panel]  # "native" first, then each tier by name
    phase: str  # "prefill", "generating", "scoring" (teacher-forced native reply) or "done"
    progress: tuple[int, int]  # (forwards done, forwards expected), for a progress bar
    results: dict[str, Comparison] | None = None  # tier name -> Comparison, when phase == "done"

    @property
    def native(self) -> Panel:
        return self.panels[NATIVE]

    @property
    def codec(self) -> Panel:
        """The first codec panel (the only one in a side-by-side run)."""
        return next(p for label, p in self.panels.items() if label != NATIVE)

    @property
    def result(self) -> Comparison | None:
        """The first tier's Comparison (the only one in a side-by-side run), once done."""
        return next(iter(self.results.values())) if self.results else None


def raw_until_counts(cache) -> list[tuple[int | None, int]]:
    """(N, codec layers) for each N that `cache`'s codec layers hold their tokens raw until, most layers first
    (CodecCache.raw_until: 0 = archiving from the first unit, None = never); [] for a native cache."""
    if not isinstance(cache, CodecCache):
        return []
    values = list(cache.raw_until.values())
    counts = {value: values.count(value) for value in values}
    return sorted(counts.items(), key=lambda item: -item[1])


def attention_counts(cache) -> dict[str, int]:
    """How many codec layers of `cache` read their archive in each mode (MODES order); {} for a native cache."""
    if not isinstance(cache, CodecCache):
        return {}
    modes = list(cache.attention.values())
    return {mode: modes.count(mode) for mode in MODES if mode in modes}
