"""Decode latency of tiers against native (python -m codeckv latency).

latency_table: each (tier, view) pair is one run_side_by_side on the same prompt: the native cache and
the codec cache generate in turns, token by token, so each row's native and codec medians come from the
same moments. materialization_free=True keeps no decoded view: attention reads the stored codes.

codes_latency_table (`--contexts 1024,4096,8192`): the default path of make_cache (attention on the stored
codes; a decoded view for the decode steps of a short context, SHORT_VIEW) at several context lengths,
every tier's cache decoding in turns with one native cache per context; each row says which path ran.
llamacpp_latency_table: the same rows for llama.cpp's KV types, each against llama.cpp's own f16 cache: compare
each engine's quantized / native ratio, not their milliseconds (another engine, its own weights' kernels).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch
from transformers import DynamicCache

from codeckv.cache import CodecCache, footprint, make_cache
from codeckv.corpus import corpus_windows
from codeckv.loaded import LoadedModel
from codeckv.measure.generate import next_logits
from codeckv.measure.llamacpp import ATTENTION as LLAMACPP_ATTENTION
from codeckv.measure.llamacpp import LlamaCppPeer
from codeckv.measure.llamacpp_runs import WARMUP_STEPS as LLAMACPP_WARMUP
from codeckv.measure.llamacpp_runs import decode_latency
from codeckv.measure.runs import attention_counts
from codeckv.measure.side_by_side import PREFILL_CHUNK, Prompt, prompt_ids, run_side_by_side
from codeckv.tiers import Tier

WARMUP_STEPS = 2  # decode steps of every run before timing starts (codes_latency_table)


def latency_table(
    loaded: LoadedModel,
    prompt: Prompt,
    tiers: list[Tier],
    max_new_tokens: int = 64,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """One row per tier and view: decode ms/token native vs codec, their ratio, prefill, match, ΔNLL, bytes."""
    rows = []
    prompt_tokens = prompt_ids(loaded, prompt, max_new_tokens).shape[1]
    for tier in tiers:
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


def _pressed(loaded: LoadedModel, tier: Tier, ids: torch.Tensor) -> CodecCache:
    """A press tier's cache after prefilling `ids` itself, PREFILL_CHUNK tokens per forward (each chunk pressed: the
    streaming protocol, whose prefill never holds more than a chunk beyond what was kept)."""
    cache = make_cache(loaded, tier, press_mode="chunked")
    for lo in range(0, ids.shape[1], PREFILL_CHUNK):
        next_logits(loaded.model, ids[:, lo : lo + PREFILL_CHUNK], cache)
    return cache


def codes_latency_table(
    loaded: LoadedModel,
    contexts: list[int],
    tiers: list[Tier],
    max_new_tokens: int = 32,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """Decode ms/token of the default path (on the stored codes; SHORT_VIEW at a short context) against native.

    Per context: one native prefill of the first N corpus tokens (PREFILL_CHUNK tokens per forward);
    every tier's cache is converted from it (CodecCache.from_cache, default materialization_free=None;
    `attention` says where its last step read); then the native cache and every tier's cache generate
    greedily in turns, one token each (round robin, the order reversed every round), so all medians of a
    context come from the same
    moments. The first WARMUP_STEPS steps are not timed. `native_bytes` is the native cache's tensors,
    `resident_bytes` what the codec cache holds (footprint), both after the last step.
    """
    if max_new_tokens <= WARMUP_STEPS:
        raise ValueError(f"codes_latency_table: max_new_tokens={max_new_tokens} leaves no timed step "
                         f"(allowed: more than {WARMUP_STEPS})")
    rows = []
    for context in contexts:
        ids = corpus_windows(loaded.tokenizer, 1, context).to(loaded.model.device)
        native = DynamicCache(config=loaded.model.config)
        start = time.perf_counter()
        for lo in range(0, context, PREFILL_CHUNK):
            logits = next_logits(loaded.model, ids[:, lo : lo + PREFILL_CHUNK], native)
        prefill_s = time.perf_counter() - start
        runs = [_Decoder("native", native, logits)]
        runs += [_Decoder(t.name, _pressed(loaded, t, ids) if t.evicts else CodecCache.from_cache(native, t), logits)
                 for t in tiers]
        for step in range(max_new_tokens):
            for run in runs if step % 2 == 0 else reversed(runs):
                run.step(loaded.model, timed=step >= WARMUP_STEPS)
        base = runs[0]
        native_ms = statistics.median(base.seconds) * 1e3
        native_bytes = sum(t.numel() * t.element_size() for layer in native.layers for t in (layer.keys, layer.values))
        for run in runs[1:]:
            held = footprint(run.cache)
            codec_ms = statistics.median(run.seconds) * 1e3
            rows.append({
                "tier": run.label,
                "engine": "transformers",
                "context": context,
                "attention": attention_counts(run.cache),
                "device": loaded.info.device,
                "dtype": loaded.info.dtype,
                "threads": torch.get_num_threads(),
                "new_tokens": max_new_tokens,
                "native_decode_ms": round(native_ms, 2),
                "codes_decode_ms": round(codec_ms, 2),
                "latency_ratio": round(codec_ms / native_ms, 3),
                "native_prefill_s": round(prefill_s, 2),
                "token_match": sum(a == b for a, b in zip(run.tokens, base.tokens)) / max_new_tokens,
                "native_bytes": native_bytes,
                "resident_bytes": held.resident_bytes,
                "resident_vs_native": round(held.resident_bytes / native_bytes, 4),
            })
            if progress:
                progress(f"{run.label} at {context}")
    return rows


def llamacpp_latency_table(
    loaded: LoadedModel,
    contexts: list[int],
    peers: list[LlamaCppPeer],
    max_new_tokens: int = 32,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """codes_latency_table's rows for llama.cpp's KV types (measure/llamacpp_runs.decode_latency): each against
    llama.cpp's own f16 cache (the `native_*` columns), decoding in turns in the same moments, one thread each."""
    ids = corpus_windows(loaded.tokenizer, 1, max(contexts))[0]
    steps = max_new_tokens - LLAMACPP_WARMUP
    rows = []
    for row in decode_latency(ids, peers, contexts, steps, loaded.info.name, progress=progress):
        rows.append({
            "tier": row.peer,
            "engine": "llama.cpp",
            "context": row.context,
            "attention": {LLAMACPP_ATTENTION: len(loaded.info.layer_types)},
            "device": "cpu",
            "dtype": "gguf weights",
            "threads": row.threads,
            "new_tokens": max_new_tokens,
            "native_decode_ms": row.f16_decode_ms,  # llama.cpp's f16 cache, in the same moments
            "codes_decode_ms": row.decode_ms,
            "latency_ratio": row.ratio_vs_f16,
            "native_prefill_s": math.nan,
            "token_match": row.token_match,
        })
    return rows


class _Decoder:
    """One cache generating greedily after the prefill's logits, timing every forward."""

    def __init__(self, label: str, cache, logits: torch.Tensor) -> None:
        self.label, self.cache = label, cache
        self.next_id = logits.argmax(-1, keepdim=True)  # (1, 1)
        self.tokens: list[int] = []
        self.seconds: list[float] = []

    def step(self, model, timed: bool) -> None:
        """Feed the last greedy token, pick the next one."""
        self.tokens.append(int(self.next_id))
        start = time.perf_counter()
        logits = next_logits(model, self.next_id, self.cache)
        if timed:
            self.seconds.append(time.perf_counter() - start)
        self.next_id = logits.argmax(-1, keepdim=True)
