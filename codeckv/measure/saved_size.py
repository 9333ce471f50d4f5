"""Caches at rest and on disk, per tier: what a compacted cache holds, how long its view takes to rebuild, the
size of its saved file against its archive, and whether a resumed cache answers exactly as the saved one.

    rows = saved_size_table(loaded, ["turbo-4", "pca-8x"], context=2048, folder=Path("out/saved"))

The prompt (`context` corpus tokens) is prefilled once into a native cache; each tier's cache is filled from
it (CodecCache.from_cache, as the Chat does) and teacher-forced `decode_steps` more corpus tokens, so decode-time
archiving is in it too. Then, per tier: held bytes with the decoded view; compact() and the bytes held at rest
(archive + raw tokens, exact, from the tensors); restore() seconds (median of `reps`); save() and the file's
bytes against the archive's (target: within 1% + 4 KiB); load_cache() and one more token through the loaded and
the original cache (resume_exact: the same logits, bit for bit).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DynamicCache

from codeckv.cache import CodecCache, footprint
from codeckv.cache.calibration import calibration_for
from codeckv.cache.saved_load import load_cache
from codeckv.corpus import corpus_windows
from codeckv.loaded import LoadedModel
from codeckv.measure.generate import next_logits
from codeckv.tiers import Tier

SLACK_FRACTION, SLACK_BYTES = 0.01, 4096  # the file-size target: archive bytes x 1.01 + 4 KiB


@dataclass
class SavedSizeRow:
    tier: str
    tokens: int
    native_bytes: int  # the native cache of the same tokens (the model's dtype)
    view_held_bytes: int  # the codec cache with its decoded view (what a running cache holds)
    rest_held_bytes: int  # the same cache compacted: archive + raw tokens
    code_bytes: int  # of which the archived tokens' codes and metadata
    raw_bytes: int  # of which the raw tokens (sinks, tail, recent window)
    rest_over_native: float
    restore_ms: float  # rebuilding the decoded view from the archive (median)
    file_bytes: int
    file_over_archive: float
    overhead_bytes: int  # file - archive: token ids, the JSON and safetensors headers
    within_target: bool  # file <= archive x 1.01 + 4 KiB
    load_ms: float  # load_cache: checks, reading, placing (not rebuilding the view)
    resume_exact: bool  # the loaded cache's next logits equal the saved cache's, bit for bit


@torch.inference_mode()
def saved_size_table(loaded: LoadedModel, tiers: list[Tier], context: int = 2048, folder: Path = Path("out/saved-size"),
                     decode_steps: int = 8, reps: int = 3,
                     progress: Callable[[str], None] | None = None) -> list[SavedSizeRow]:
    """One SavedSizeRow per tier (module docstring); the files are written into `folder`."""
    device = loaded.model.device
    ids = corpus_windows(loaded.tokenizer, 1, context + decode_steps + 1)[0].to(device)
    native = DynamicCache(config=loaded.model.config)
    for lo in range(0, context, 512):
        next_logits(loaded.model, ids[None, lo : min(context, lo + 512)], native)
    per_token = footprint(native).archive_bytes // context  # native bytes per token (K and V, every layer)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for tier in tiers:
        cache = CodecCache.from_cache(native, tier, False, calibration_for(loaded, tier))  # with its view
        for t in range(context, context + decode_steps):
            next_logits(loaded.model, ids[None, t : t + 1], cache)
        held = context + decode_steps
        view = cache.footprint()
        seconds = []
        for _ in range(reps):
            cache.compact()
            seconds.append(cache.restore())
        cache.compact()
        rest = cache.footprint()
        path = folder / f"{tier.name}.kvc"
        size = cache.save(path, ids[:held], loaded)
        start = time.perf_counter()
        resumed = load_cache(path, loaded).cache
        load_s = time.perf_counter() - start
        feed = ids[None, held : held + 1]
        exact = torch.equal(next_logits(loaded.model, feed, resumed), next_logits(loaded.model, feed, cache))
        at_rest = rest.resident_bytes + rest.native_layer_bytes
        archive = rest.archive_bytes + rest.native_layer_bytes
        codes = sum(f.code_bytes for f in rest.layers if f.full_attention)
        rows.append(SavedSizeRow(
            tier=tier.name, tokens=held, native_bytes=per_token * held,
            view_held_bytes=view.resident_bytes + view.native_layer_bytes, rest_held_bytes=at_rest,
            code_bytes=codes, raw_bytes=rest.archive_bytes - codes, rest_over_native=at_rest / (per_token * held),
            restore_ms=1000 * statistics.median(seconds), file_bytes=size, file_over_archive=size / archive,
            overhead_bytes=size - archive, within_target=size <= archive * (1 + SLACK_FRACTION) + SLACK_BYTES,
            load_ms=1000 * load_s, resume_exact=exact,
        ))
        del cache, resumed
        if progress:
            progress(tier.name)
    return rows
