"""Side by side: greedy generation with the native cache and with codec caches, streamed as tokens come.

    for update in stream_side_by_side(loaded, [{"role": "user", "content": "Hi!"}], "turbo-4"):
        show(update.native.text, update.codec.text)
    update.result        # Comparison: latency, token match, bytes, ΔNLL% of the turn (final update only)

Every run starts from the same prompt ids. The native run and each codec run advance in
turns, one token each (round robin, the order reversed every round), in the same process,
so both panels fill together and their latencies are measured under the same machine load
(design.md). `stream_runs` takes several tiers at once: the sweep runs native once beside
all of them.

After generation, the native continuation is teacher-forced through a fresh native cache
and a fresh codec cache (measure/nll.py with prefix = the prompt): the turn's ΔNLL%.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from codeckv.cache import CodecCache, footprint, make_cache
from codeckv.generate import chat_input_ids, greedy_stream, stop_token_ids
from codeckv.measure.nll import decode_nll, delta_percent
from codeckv.models import LoadedModel
from codeckv.tiers import Tier, as_tier, get_tier

NATIVE = "native"  # label of the reference run
Prompt = str | list[dict] | torch.Tensor  # raw text, chat messages [{"role": ..., "content": ...}], or (1, T) ids


@dataclass
class Panel:
    """What one run has generated so far."""

    label: str  # "native" or a tier name
    token_ids: list[int]
    text: str  # decoded without special tokens
    done: bool  # stopped at a stop token or at max_new_tokens


@dataclass
class RunStats:
    """One finished run: its tokens, its latency and the bytes its cache holds."""

    label: str
    token_ids: list[int]
    text: str
    prefill_s: float  # the prompt's forward plus archiving it (a codec cache encodes the prompt right after)
    decode_ms: float  # median ms per decode step after one warm-up step (nan with fewer than 2 decode steps)
    decode_ms_mean: float  # mean of the same steps: includes the periodic block-archiving steps the median hides
    tokens_per_s: float  # generated tokens / wall seconds of all its forwards, prefill included
    step_ms: list[float]  # every forward, prefill first
    archive_bytes: int  # full-attention layers: what the cache must keep (a native cache: what it holds)
    resident_bytes: int  # full-attention layers: archive + materialized view + capacity slack
    bf16_bytes: int  # a bf16 native cache of the same tokens (the reference of every ratio)
    native_layer_bytes: int  # sliding-window / linear layers, which always stay native
    peak_memory_bytes: int
    peak_memory_source: str  # what peak_memory_bytes measures (see _PEAK_SOURCE)


@dataclass
class Comparison:
    """A codec run against the native run of the same prompt."""

    tier: str
    description: str
    native: RunStats
    codec: RunStats
    token_match: float  # fraction of the native run's positions where the codec emitted the same token
    first_divergence: int | None  # first position where they differ (or one has stopped), None if identical
    latency_ratio: float  # codec decode_ms / native decode_ms
    ratio_vs_bf16: float  # codec archive bytes / bf16 bytes of the same tokens
    nll_native: float  # mean NLL of the native continuation teacher-forced through a native cache
    nll_codec: float  # ... through the codec cache
    delta_nll_pct: float
    token_nll_native: list[float] = field(default_factory=list)  # (n - 1,) per scored token, nats
    token_nll_codec: list[float] = field(default_factory=list)  # (n - 1,)
    scored_tokens: list[str] = field(default_factory=list)  # (n - 1,) the native tokens 1..n-1, as text

    def summary(self) -> dict:
        """One flat row: the numbers a table or a JSON report shows."""
        return {
            "tier": self.tier,
            "archive_bytes": self.codec.archive_bytes,
            "resident_bytes": self.codec.resident_bytes,
            "bf16_bytes": self.codec.bf16_bytes,
            "native_bytes": self.native.archive_bytes,
            "ratio_vs_bf16": self.ratio_vs_bf16,
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
            "peak_memory_bytes": self.codec.peak_memory_bytes,
            "native_peak_memory_bytes": self.native.peak_memory_bytes,
            "peak_memory_source": self.codec.peak_memory_source,
        }


@dataclass
class Update:
    """One streamed state: every panel so far; `results` only on the final update."""

    panels: dict[str, Panel]  # "native" first, then each tier by name
    phase: str  # "generating", "scoring" (teacher-forced NLL) or "done"
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


_PEAK_SOURCE = {
    "cuda": "cuda max_memory_allocated during the run's forwards (process-wide: weights, all caches, activations)",
    "cpu": "cache resident bytes (CPU: tensors the cache holds, view and capacity slack included)",
}


def prompt_ids(loaded: LoadedModel, prompt: Prompt, max_new_tokens: int = 0) -> torch.Tensor:
    """(1, T) ids: chat messages through the chat template, raw text as is, ids unchanged.

    Raises ValueError when T + max_new_tokens exceeds the model's context.
    """
    device = loaded.model.device
    if isinstance(prompt, torch.Tensor):
        ids = prompt.reshape(1, -1).to(device)
    elif isinstance(prompt, str):
        ids = loaded.tokenizer(prompt, return_tensors="pt").input_ids.to(device)
    else:
        ids = chat_input_ids(loaded.tokenizer, prompt, device)
    if ids.shape[1] + max_new_tokens > loaded.info.max_context:
        raise ValueError(
            f"the prompt is {ids.shape[1]} tokens; with {max_new_tokens} new tokens it exceeds "
            f"{loaded.info.name}'s context of {loaded.info.max_context} tokens: shorten it"
        )
    return ids


def stream_side_by_side(
    loaded: LoadedModel, prompt: Prompt, tier: Tier | str, max_new_tokens: int = 64, stop_at_eos: bool = True,
    materialization_free: bool = False,
) -> Iterator[Update]:
    """Native vs one tier, token by token; the final update carries `result` (a Comparison)."""
    return stream_runs(loaded, prompt, [tier], max_new_tokens, stop_at_eos, materialization_free)


def run_side_by_side(
    loaded: LoadedModel, prompt: Prompt, tier: Tier | str, max_new_tokens: int = 64, stop_at_eos: bool = True,
    materialization_free: bool = False,
) -> Comparison:
    """stream_side_by_side, consumed: the Comparison only."""
    updates = stream_side_by_side(loaded, prompt, tier, max_new_tokens, stop_at_eos, materialization_free)
    return deque(updates, maxlen=1)[0].result


class _Run:
    """One greedy run in progress: its cache, its token stream and what it produced."""

    def __init__(self, loaded: LoadedModel, label: str, tier: Tier, ids: torch.Tensor, max_new: int, stop_ids,
                 materialization_free: bool = False):
        self.label, self.tier, self.materialization_free = label, tier, materialization_free
        self.cache = make_cache(loaded.model.config, tier, materialization_free)
        self.stream = greedy_stream(loaded.model, ids, self.cache, max_new, stop_ids)
        self.max_new, self.stop_ids = max_new, stop_ids
        self.token_ids: list[int] = []
        self.seconds: list[float] = []
        self.peak = 0  # cuda max_memory_allocated over this run's forwards
        self.done = False

    def advance(self, device: torch.device) -> None:
        """Run one forward (prefill or one decode step)."""
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        step = next(self.stream)
        seconds = step.seconds
        if step.index == 0 and isinstance(self.cache, CodecCache):  # archiving the prompt is part of the prefill
            start = time.perf_counter()
            self.cache.flush()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds += time.perf_counter() - start
        if device.type == "cuda":
            self.peak = max(self.peak, torch.cuda.max_memory_allocated(device))
        self.token_ids.append(step.token_id)
        self.seconds.append(seconds)
        if step.token_id in self.stop_ids or len(self.token_ids) == self.max_new:
            self.done = True
            self.stream.close()

    def stats(self, loaded: LoadedModel) -> RunStats:
        fp = footprint(self.cache)
        device = loaded.model.device.type
        decode = self.seconds[2:]  # seconds[0] is the prefill, seconds[1] the warm-up step
        peak = self.peak if device == "cuda" else fp.resident_bytes + fp.native_layer_bytes
        return RunStats(
            label=self.label,
            token_ids=list(self.token_ids),
            text=_text(loaded, self.token_ids),
            prefill_s=self.seconds[0],
            decode_ms=1000 * statistics.median(decode) if decode else math.nan,
            decode_ms_mean=1000 * statistics.fmean(decode) if decode else math.nan,
            tokens_per_s=len(self.token_ids) / sum(self.seconds),
            step_ms=[1000 * s for s in self.seconds],
            archive_bytes=fp.archive_bytes,
            resident_bytes=fp.resident_bytes,
            bf16_bytes=fp.bf16_bytes,
            native_layer_bytes=fp.native_layer_bytes,
            peak_memory_bytes=peak,
            peak_memory_source=_PEAK_SOURCE["cuda" if device == "cuda" else "cpu"],
        )


def stream_runs(
    loaded: LoadedModel,
    prompt: Prompt,
    tiers: list[Tier | str],
    max_new_tokens: int = 64,
    stop_at_eos: bool = True,
    materialization_free: bool = False,
) -> Iterator[Update]:
    """Native and every tier generate in turns, one token each; then each is scored; the last update has results.

    A native tier in `tiers` runs as a second native cache: its latency ratio shows the timing noise.
    materialization_free: the codec caches keep no decoded view (attention reads the stored codes).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
    tiers = [as_tier(t) for t in tiers]
    ids = prompt_ids(loaded, prompt, max_new_tokens)  # (1, T)
    stop_ids = stop_token_ids(loaded.tokenizer, loaded.model) if stop_at_eos else frozenset()
    device = loaded.model.device
    labels = _labels(tiers)
    runs = [_Run(loaded, NATIVE, get_tier(NATIVE), ids, max_new_tokens, stop_ids)]
    runs += [_Run(loaded, label, tier, ids, max_new_tokens, stop_ids, materialization_free)
             for label, tier in zip(labels, tiers)]
    total = 2 * len(runs) * max_new_tokens  # generation forwards + teacher-forced forwards (upper bound)
    done = 0

    rounds = 0
    while not all(run.done for run in runs):
        for run in runs if rounds % 2 == 0 else runs[::-1]:  # alternate the order: no run always goes first
            if not run.done:
                run.advance(device)
                done += 1 + (max_new_tokens - len(run.token_ids) if run.done else 0)
        rounds += 1
        yield Update(_panels(loaded, runs), "generating", (done, total))

    stats = {run.label: run.stats(loaded) for run in runs}
    native = stats[NATIVE]
    window = torch.cat([ids[0].cpu(), torch.tensor(native.token_ids)])  # (T + n,) prompt + native continuation
    panels = _panels(loaded, runs)
    nlls = {}
    for run in runs:
        nlls[run.label] = _turn_nll(loaded, window, ids.shape[1], run.tier, run.materialization_free)
        done += max_new_tokens
        yield Update(panels, "scoring", (done, total))

    scored = [loaded.tokenizer.decode([t]) for t in native.token_ids[1:]]
    results = {
        label: _compare(tier, native, stats[label], nlls[NATIVE], nlls[label], scored)
        for label, tier in zip(labels, tiers)
    }
    yield Update(panels, "done", (total, total), results)


def _labels(tiers: list[Tier]) -> list[str]:
    """Tier names, unique; a native tier among them becomes "native (again)" beside the reference run."""
    labels = []
    for tier in tiers:
        label = tier.name if tier.name != NATIVE else f"{NATIVE} (again)"
        if label in labels:
            raise ValueError(f"tier {tier.name!r} is listed twice")
        labels.append(label)
    return labels


def _panels(loaded: LoadedModel, runs: list[_Run]) -> dict[str, Panel]:
    return {r.label: Panel(r.label, list(r.token_ids), _text(loaded, r.token_ids), r.done) for r in runs}


def _text(loaded: LoadedModel, token_ids: list[int]) -> str:
    return loaded.tokenizer.decode(token_ids, skip_special_tokens=True)


def _turn_nll(loaded: LoadedModel, window: torch.Tensor, prompt_len: int, tier: Tier, free: bool) -> torch.Tensor:
    """(n - 1,) per-token NLL of the native continuation after the prompt; empty if it has < 2 tokens."""
    if window.shape[0] - prompt_len < 2:
        return torch.empty(0)
    fresh = lambda: make_cache(loaded.model.config, tier, free)  # noqa: E731
    return decode_nll(loaded.model, window, fresh, prefix=prompt_len).token_nll


def _compare(
    tier: Tier, native: RunStats, codec: RunStats, nll_native: torch.Tensor, nll_codec: torch.Tensor, scored: list[str]
) -> Comparison:
    ref, got = native.token_ids, codec.token_ids
    same = [i < len(got) and got[i] == t for i, t in enumerate(ref)]
    differ = [i for i in range(max(len(ref), len(got))) if i >= len(ref) or i >= len(got) or ref[i] != got[i]]
    mean_native = float(nll_native.mean()) if nll_native.numel() else math.nan
    mean_codec = float(nll_codec.mean()) if nll_codec.numel() else math.nan
    return Comparison(
        tier=tier.name,
        description=tier.description,
        native=native,
        codec=codec,
        token_match=sum(same) / len(ref),
        first_divergence=differ[0] if differ else None,
        latency_ratio=codec.decode_ms / native.decode_ms,
        ratio_vs_bf16=codec.archive_bytes / codec.bf16_bytes if codec.bf16_bytes else math.nan,
        nll_native=mean_native,
        nll_codec=mean_codec,
        delta_nll_pct=delta_percent(mean_codec, mean_native) if nll_native.numel() else math.nan,
        token_nll_native=nll_native.tolist(),
        token_nll_codec=nll_codec.tolist(),
        scored_tokens=scored,
    )
