"""Resume against recompute: continuing a conversation from its saved .kvc file, or prefilling it again natively.

    rows = resume_table(loaded, [TIERS["turbo-4"], TIERS["pca-8x"]], contexts=[1024, 4096, 8192])

What stored-cache systems (LMCache, KVTC) lead with: the time to the first new token when a conversation of
`context` tokens goes on with a new message of `question` tokens. Resume: load_cache (the file's checks, reading,
placing), rebuild what the cache attends through (a decoded view, for png and the PCA tiers; nothing for a cache
on its codes), then the new message's forward. Recompute: a native prefill of the conversation and the message
together, 512 tokens a forward, as the Chat prefills. Each is the median of `reps` runs; the file is read from
the page cache (it was just written), so `read_ms` is the checks and the copy, not a disk.

The saved cache is the one the Chat keeps: the native prefill converted (CodecCache.from_cache) in make_cache's
default mode (on the stored codes wherever a kernel reads them), compacted as an idle session is.
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
from codeckv.measure.runs import attention_counts
from codeckv.measure.side_by_side import PREFILL_CHUNK
from codeckv.tiers import Tier


@dataclass
class ResumeRow:
    tier: str
    context: int  # tokens of the saved conversation
    question: int  # tokens of the new message
    file_bytes: int
    native_bytes: int  # a native cache of the conversation's tokens (the model's dtype)
    attention: dict[str, int]  # codec layers per attention mode of the resumed cache
    read_ms: float  # load_cache: checks, reading, placing (median)
    rebuild_ms: float  # restore(): the decoded view from the archive; 0 for a cache on its codes (median)
    first_token_ms: float  # the new message's forward through the resumed cache (median)
    resume_ms: float  # read + rebuild + first token, each run summed (median)
    recompute_ms: float  # native prefill of the conversation and the message (median)
    resume_over_recompute: float


def _recompute_seconds(loaded: LoadedModel, ids: torch.Tensor) -> float:
    """A native prefill of ids (1, T) in PREFILL_CHUNK-token forwards: the seconds to the last position's logits."""
    cache = DynamicCache(config=loaded.model.config)
    start = time.perf_counter()
    for lo in range(0, ids.shape[1], PREFILL_CHUNK):
        next_logits(loaded.model, ids[:, lo : lo + PREFILL_CHUNK], cache)
    return time.perf_counter() - start


@torch.inference_mode()
def resume_table(loaded: LoadedModel, tiers: list[Tier], contexts: list[int], question: int = 16, reps: int = 3,
                 folder: Path = Path("out/resume"), progress: Callable[[str], None] | None = None) -> list[ResumeRow]:
    """One ResumeRow per tier and context (module docstring); the files are written into `folder`."""
    if any(tier.is_native for tier in tiers):
        raise ValueError("resume measures codec tiers against native (allowed: tiers that encode)")
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for context in contexts:
        ids = corpus_windows(loaded.tokenizer, 1, context + question).to(loaded.model.device)  # (1, T)
        recompute = statistics.median(_recompute_seconds(loaded, ids) for _ in range(reps))
        native = DynamicCache(config=loaded.model.config)
        for lo in range(0, context, PREFILL_CHUNK):
            next_logits(loaded.model, ids[:, lo : min(context, lo + PREFILL_CHUNK)], native)
        native_bytes = footprint(native).archive_bytes
        for tier in tiers:
            cache = CodecCache.from_cache(native, tier, None, calibration_for(loaded, tier), raw_until=None)
            cache.compact()
            path = folder / f"{tier.name}-{context}.kvc"
            size = cache.save(path, ids[:, :context], loaded)
            del cache
            runs = []
            for _ in range(reps):
                start = time.perf_counter()
                resumed = load_cache(path, loaded).cache
                loaded_at = time.perf_counter()
                resumed.restore()
                rebuilt_at = time.perf_counter()
                next_logits(loaded.model, ids[:, context:], resumed)
                runs.append((loaded_at - start, rebuilt_at - loaded_at, time.perf_counter() - rebuilt_at))
                modes = attention_counts(resumed)
                del resumed
            read, rebuild, first = (1000 * statistics.median(r[i] for r in runs) for i in range(3))
            resume = 1000 * statistics.median(sum(r) for r in runs)
            rows.append(ResumeRow(tier.name, context, question, size, native_bytes, modes, read, rebuild, first,
                                  resume, 1000 * recompute, resume / (1000 * recompute)))
            if progress:
                progress(f"{tier.name} at {context:,} tokens")
    return rows
