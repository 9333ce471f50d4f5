"""Side by side: native and codec caches answer the same prompt, streamed token by token.

    for update in stream_side_by_side(loaded, [{"role": "user", "content": "Hi!"}], "turbo-4"):
        show(update.native.text, update.codec.text)
    update.result        # Comparison (final update only): bytes, latency, token match, KLD / top-1 / ΔNLL

One turn of `stream_turn` (measure/chat.py keeps the caches across turns; `stream_runs` starts fresh):

1. prefill the prompt tokens the caches do not hold yet, PREFILL_CHUNK tokens per forward (a Stop
   takes effect between chunks). A cache whose attention reads the stored codes (the default) prefills
   through itself: each chunk attends to the archive on the codes and to itself at full precision, and
   is archived at the next chunk, so it never holds the prompt at full precision (its peak is the archive
   plus one chunk). A cache with a decoded view is filled on empty caches from the native prefill and
   archives it in one encode per layer (CodecCache.from_cache): the prompt attends to itself at full
   precision, as one forward over it would. `RunStats.prefill_path` says which ran.
2. every run generates greedily, one token each in turn (round robin, the order reversed every round),
   in one process, so all latencies are measured under the same machine load (design.md).
3. every other cache is rewound to the prompt and fed the native reply (teacher forcing), so both
   caches predict each reply token from the same tokens: KL divergence from the native next-token
   distribution, top-1 agreement and ΔNLL of the turn (measure/lockstep.py). Afterwards all caches
   hold the same conversation. Rewinding crops the codec archive: the few prompt tokens of the archive
   unit that straddles the prompt's end return to the raw tail with their decoded values.

A native tier among the others runs as a second native cache: its latency ratio shows the timing noise.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections import deque
from collections.abc import Iterator

import torch
from transformers import Cache, DynamicCache

from codeckv.cache import VIEW, CodecCache, footprint, held_bytes, make_cache, view_reason
from codeckv.cache.calibration import Deferred, calibration_for, ready_or_deferred
from codeckv.cache.layers import CodecLayer
from codeckv.loaded import LoadedModel
from codeckv.measure.follower import Follower
from codeckv.measure.generate import chat_input_ids, next_logits, stop_token_ids
from codeckv.measure.lockstep import delta_percent, kl_divergence
from codeckv.measure.runs import (
    NATIVE,
    PEAK_SOURCE,
    Comparison,
    Panel,
    Prompt,
    RunStats,
    Update,
    attention_counts,
    raw_until_counts,
)
from codeckv.presses import Budget
from codeckv.tiers import Tier, get_tier

PREFILL_CHUNK = 512  # prompt tokens per forward


def prompt_ids(loaded: LoadedModel, prompt: Prompt, max_new_tokens: int = 0, limit: int | None = None):
    """(1, T) ids: chat messages through the chat template, raw text as is, ids unchanged.

    Raises ValueError when T + max_new_tokens exceeds the model's context, or T exceeds `limit`.
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
    if limit is not None and ids.shape[1] > limit:
        raise ValueError(f"the prompt is {ids.shape[1]:,} tokens, more than the {limit:,} allowed per request here")
    return ids


class Run:
    """One cache in a side-by-side turn: its prefill, decode steps and teacher forcing, timed."""

    def __init__(self, loaded: LoadedModel, label: str, tier: Tier, materialization_free: bool | None = None,
                 raw_until: int | None = 0) -> None:
        """raw_until: 0 archives from the first unit (a sweep, the needle: the codec itself); None holds the tokens
        raw until the tier's own N (the Chat: a short chat never holds more than native; cache/layers.py), and
        reads a PCA tier's calibration only when it first archives (a short chat does not wait for one)."""
        self.loaded, self.label, self.tier, self.materialization_free = loaded, label, tier, materialization_free
        self.raw_until = raw_until
        # what this run's caches are built with: a Deferred calibration where they hold a short context raw
        self.calibration = (ready_or_deferred if raw_until is None else calibration_for)(loaded, tier)
        self.cache = make_cache(loaded, tier, materialization_free, self.calibration, raw_until=raw_until)
        self.held = 0  # tokens the cache holds
        self.start_turn(0, 0)

    def bind(self, loaded: LoadedModel | None) -> None:
        """Run on `loaded` from now on; None: hold no model (an idle chat between turns, measure/chat.py, so that a
        model the pool drops is freed). The cache's tokens stay valid on a model loaded again under the same name."""
        self.loaded = loaded
        if isinstance(self.calibration, Deferred):
            self.calibration.loaded = loaded

    @property
    def on_codes(self) -> bool:
        """True when some layer attends on this run's stored codes (no view beyond a short context's)."""
        return bool(attention_counts(self.cache).keys() - {VIEW})

    @property
    def view_reason(self) -> str | None:
        """Why some layers read a decoded view (None where none does): the tier's reason, or the caller asked."""
        if VIEW not in attention_counts(self.cache):
            return None
        return view_reason(self.tier) or "asked for"

    def start_turn(self, prompt_tokens: int, max_new: int) -> None:
        self.prompt_tokens, self.max_new = prompt_tokens, max_new
        self.token_ids: list[int] = []
        self.seconds: list[float] = []  # the prefill (with archiving), then every decode step
        self.logprobs: list[torch.Tensor] = []  # (vocab,) float32 per generated position (kept by the reference)
        self.first_logprobs: torch.Tensor | None = None  # the prefill's prediction
        self.peak = 0  # cuda max_memory_allocated over this run's forwards
        self.peak_held = held_bytes(self.cache)  # the most the cache's own tensors held after a forward
        self.prefill_path = "native" if self.tier.is_native else "through the codec cache"
        self.done = False
        self.follower: Follower | None = None  # native fed this run's own tokens (stream_turn's follow_own)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Feed ids (1, n): the last position's fp32 logits (vocab,) and the seconds it took."""
        device = self.loaded.model.device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        logits = next_logits(self.loaded.model, ids, self.cache)[0]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            self.peak = max(self.peak, torch.cuda.max_memory_allocated(device))
        took = time.perf_counter() - start
        self.held += ids.shape[1]
        self.peak_held = max(self.peak_held, held_bytes(self.cache))
        return logits, took

    def archive(self) -> float:
        """Archive what became archivable (the prompt after its prefill): seconds it took."""
        start = time.perf_counter()
        for layer in self.cache.layers:
            if isinstance(layer, CodecLayer):
                layer.flush()
        if self.loaded.model.device.type == "cuda":
            torch.cuda.synchronize(self.loaded.model.device)
        return time.perf_counter() - start

    def accept(self, logits: torch.Tensor, seconds: float, stop_ids, keep: bool) -> None:
        """Take the argmax of `logits` as the next token; keep its log-probs if this run is the reference; a
        follower (native on this run's tokens) compares them with native's."""
        logprobs = torch.log_softmax(logits, dim=-1).cpu()
        if self.first_logprobs is None:
            self.first_logprobs = logprobs
        if keep:
            self.logprobs.append(logprobs)
        if self.follower is not None:
            self.follower.compare(logprobs)
        token = int(logits.argmax())
        self.token_ids.append(token)
        self.seconds.append(seconds)
        self.done = token in stop_ids or len(self.token_ids) == self.max_new

    def step(self, stop_ids, keep: bool) -> None:
        """One decode step: feed the last token, take the next."""
        last = torch.tensor([[self.token_ids[-1]]], device=self.loaded.model.device)
        if self.follower is not None:
            self.follower.feed(last)
        self.accept(*self.forward(last), stop_ids, keep)

    def panel(self) -> Panel:
        return Panel(self.label, list(self.token_ids), _text(self.loaded, self.token_ids), self.done)

    def stats(self) -> RunStats:
        fp = footprint(self.cache)
        device = self.loaded.model.device.type
        decode = self.seconds[2:]  # seconds[0] is the prefill, seconds[1] the warm-up step
        peak = self.peak if device == "cuda" else self.peak_held
        return RunStats(
            label=self.label,
            token_ids=list(self.token_ids),
            text=_text(self.loaded, self.token_ids),
            prompt_tokens=self.prompt_tokens,
            prefill_s=self.seconds[0],
            decode_ms=1000 * statistics.median(decode) if decode else math.nan,
            decode_ms_mean=1000 * statistics.fmean(decode) if decode else math.nan,
            tokens_per_s=len(self.token_ids) / sum(self.seconds),
            step_ms=[1000 * s for s in self.seconds],
            footprint=fp,
            held_bytes=held_bytes(self.cache),
            peak_held_bytes=self.peak_held,
            peak_memory_bytes=peak,
            peak_memory_source=PEAK_SOURCE["cuda" if device == "cuda" else "cpu"],
            attention=attention_counts(self.cache),
            view_reason=self.view_reason,
            prefill_path=self.prefill_path,
            raw_until=raw_until_counts(self.cache),
        )


def _text(loaded: LoadedModel, token_ids: list[int]) -> str:
    return loaded.tokenizer.decode(token_ids, skip_special_tokens=True)


def filled_from(native: Cache, run: Run) -> Cache:
    """A cache for run's tier holding what `native` holds (converted in one batched encode), native left as it was."""
    if run.tier.is_native:
        return copy.deepcopy(native)
    return CodecCache.from_cache(native, run.tier, run.materialization_free, run.calibration,
                                 raw_until=run.raw_until)


def _presses_once(run: Run) -> bool:
    """True when run's cache presses the context once (press_mode "once") rather than every chunk."""
    return isinstance(run.cache, CodecCache) and run.cache.press_mode == "once" and not isinstance(run.tier.press,
                                                                                                    Budget)


def stream_turn(
    loaded: LoadedModel, runs: list[Run], ids: torch.Tensor, max_new_tokens: int, stop_ids, follow_own: bool = False
) -> Iterator[Update]:
    """One turn for every run on the prompt ids (1, T), which extend what the caches hold; runs[0] is native.
    follow_own: also compare each codec run with native along the run's own reply (Follower)."""
    reference, others = runs[0], runs[1:]
    if any(r.held != reference.held for r in others) or reference.held >= ids.shape[1]:
        raise ValueError("every cache must hold the same tokens, and fewer than the prompt")
    held, prompt = reference.held, ids.shape[1]
    # On empty caches a cache on its codes prefills itself; one with a view is filled from the native prefill.
    prefilling = runs if held else [reference] + [r for r in others
                                                  if r.tier.is_native or r.on_codes or r.tier.evicts]
    chunks = math.ceil((prompt - held) / PREFILL_CHUNK)
    total = chunks * len(prefilling) + len(runs) * max_new_tokens + len(others) * max_new_tokens
    done = 0

    def update(phase: str, results=None) -> Update:
        return Update({r.label: r.panel() for r in runs}, phase, (min(done, total), total), results)

    for run in runs:
        run.start_turn(prompt - held, max_new_tokens)
    for run in prefilling:
        step = PREFILL_CHUNK
        if run.tier.evicts and not held and _presses_once(run):  # kvpress's protocol: the prompt in one forward
            step = prompt
            run.prefill_path = ("in one forward through the codec cache, its press evicting from the prompt once, "
                                "after its attention (kvpress's protocol); later turns are not pressed")
        elif run.tier.evicts and not held:
            run.prefill_path = (f"in chunks of {PREFILL_CHUNK} tokens through the codec cache, its press evicting "
                                "from each chunk after the chunk's attention")
        elif run.on_codes and not held:
            run.prefill_path = f"in chunks of {PREFILL_CHUNK} tokens through the codec cache, on the codes"
        seconds = 0.0
        for lo in range(held, prompt, step):
            logits, took = run.forward(ids[:, lo : lo + step])
            seconds += took
            done += 1
            yield update("prefill")
        if run is reference:
            first_logits = logits
        run.accept(logits, seconds + run.archive(), stop_ids, run is reference)
    for run in others:
        if run not in prefilling:  # fill the codec cache from the native prefill, archive the prompt
            start = time.perf_counter()
            run.cache, run.held = filled_from(reference.cache, run), reference.held
            took = time.perf_counter() - start + run.archive()
            run.peak_held = max(run.peak_held, held_bytes(run.cache))
            run.prefill_path = "natively, then converted into the codec cache (CodecCache.from_cache)"
            run.accept(first_logits, reference.seconds[0] + took, stop_ids, False)
    if follow_own:  # native's cache holds the prompt now, before its first decode step
        for run in others:
            run.follower = Follower(loaded, reference)
            run.follower.compare(run.first_logprobs)

    rounds = 0
    while not all(run.done for run in runs):
        for run in runs if rounds % 2 == 0 else runs[::-1]:  # alternate the order: no run always goes first
            if not run.done:
                run.step(stop_ids, run is reference)
                done += 1 + (max_new_tokens - len(run.token_ids) if run.done else 0)
        rounds += 1
        yield update("generating")

    native = reference.stats()
    results = {}
    for run in others:
        logprobs = [run.first_logprobs]  # position 0: predicted by the run's own prefill
        for predicted in _teacher_force(loaded, run, reference.token_ids, ids):
            logprobs.append(predicted)
            done += 1
            if done % 8 == 0:
                yield update("scoring")
        results[run.label] = _compare(loaded, run, native, reference, logprobs)
        if run.follower is not None:
            kld, top1 = run.follower.scores()
            run.follower = None
            results[run.label].own_kld = statistics.fmean(kld)
            results[run.label].own_top1_pct = 100.0 * statistics.fmean(top1)
            results[run.label].own_token_kld = kld
        done += max_new_tokens - len(reference.token_ids)
    yield update("done", results)


def _teacher_force(loaded: LoadedModel, run: Run, reply: list[int], ids: torch.Tensor) -> Iterator[torch.Tensor]:
    """Rewind run's cache to the prompt ids, then feed the reply: log-probs (vocab,) at reply positions 1.."""
    rewind(loaded, run, ids, ids.shape[1])
    for token in reply[:-1]:
        logits, _ = run.forward(torch.tensor([[token]], device=loaded.model.device))
        yield torch.log_softmax(logits, dim=-1).cpu()


def rewind(loaded: LoadedModel, run: Run, ids: torch.Tensor, length: int) -> None:
    """Make run's cache hold exactly ids[:, :length]: crop it, or refill it when its layers cannot crop."""
    if run.held == length:
        return
    try:
        run.cache.crop(length - run.held)
        run.held = length
    except RuntimeError:  # a sliding-window layer past its window keeps no past: start from a native prefill
        native = DynamicCache(config=loaded.model.config)
        with torch.inference_mode():
            for lo in range(0, length, PREFILL_CHUNK):
                next_logits(loaded.model, ids[:, lo : min(length, lo + PREFILL_CHUNK)], native)
        run.cache = native if run.tier.is_native else filled_from(native, run)
        run.held = length


def _compare(loaded: LoadedModel, run: Run, native: RunStats, reference: Run, logprobs: list) -> Comparison:
    reply = reference.token_ids
    want, got = torch.stack(reference.logprobs), torch.stack(logprobs)  # (n, vocab)
    target = torch.tensor(reply)[:, None]
    nll_native, nll_codec = -want.gather(1, target)[:, 0], -got.gather(1, target)[:, 0]
    kld = kl_divergence(want, got)
    codec = run.stats()
    ref, out = native.token_ids, codec.token_ids
    same = [i < len(out) and out[i] == t for i, t in enumerate(ref)]
    differ = [i for i in range(max(len(ref), len(out))) if i >= len(ref) or i >= len(out) or ref[i] != out[i]]
    mean_native, mean_codec = float(nll_native.mean()), float(nll_codec.mean())
    return Comparison(
        tier=run.tier.name,
        description=run.tier.description,
        native=native,
        codec=codec,
        token_match=sum(same) / len(ref),
        first_divergence=differ[0] if differ else None,
        latency_ratio=codec.decode_ms / native.decode_ms,
        ratio_vs_bf16=codec.footprint.ratio,
        steady_state_ratio=codec.footprint.steady_state_ratio,
        kld=float(kld.mean()),
        top1_pct=100.0 * float((got.argmax(1) == want.argmax(1)).double().mean()),
        nll_native=mean_native,
        nll_codec=mean_codec,
        delta_nll_pct=delta_percent(mean_codec, mean_native),
        token_kld=kld.tolist(),
        token_nll_native=nll_native.tolist(),
        token_nll_codec=nll_codec.tolist(),
        scored_tokens=[loaded.tokenizer.decode([t]) for t in reply],
    )


def labels_of(tiers: list[Tier]) -> list[str]:
    """Tier names, unique; a native tier among them becomes "native (again)" beside the reference run."""
    labels = []
    for tier in tiers:
        label = tier.name if tier.name != NATIVE else f"{NATIVE} (again)"
        if label in labels:
            raise ValueError(f"tier {tier.name!r} is listed twice")
        labels.append(label)
    return labels


def stream_runs(
    loaded: LoadedModel,
    prompt: Prompt,
    tiers: list[Tier],
    max_new_tokens: int = 64,
    stop_at_eos: bool = True,
    materialization_free: bool | None = None,
) -> Iterator[Update]:
    """Native and every tier on fresh caches, one turn; the last update carries the results.

    materialization_free: None (default) = attention on the stored codes wherever a tier allows, False = a
    decoded view, True = on the codes (codeckv.cache.make_cache).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
    ids = prompt_ids(loaded, prompt, max_new_tokens)
    stop_ids = stop_token_ids(loaded.tokenizer, loaded.model) if stop_at_eos else frozenset()
    runs = [Run(loaded, NATIVE, get_tier(NATIVE))]
    runs += [Run(loaded, label, tier, materialization_free) for label, tier in zip(labels_of(tiers), tiers)]
    yield from stream_turn(loaded, runs, ids, max_new_tokens, stop_ids)


def stream_side_by_side(
    loaded: LoadedModel, prompt: Prompt, tier: Tier, max_new_tokens: int = 64, stop_at_eos: bool = True,
    materialization_free: bool | None = None,
) -> Iterator[Update]:
    """Native vs one tier, token by token; the final update carries `result` (a Comparison)."""
    return stream_runs(loaded, prompt, [tier], max_new_tokens, stop_at_eos, materialization_free)


def run_side_by_side(
    loaded: LoadedModel, prompt: Prompt, tier: Tier, max_new_tokens: int = 64, stop_at_eos: bool = True,
    materialization_free: bool | None = None,
) -> Comparison:
    """stream_side_by_side, consumed: the Comparison only."""
    updates = stream_side_by_side(loaded, prompt, tier, max_new_tokens, stop_at_eos, materialization_free)
    return deque(updates, maxlen=1)[0].result
