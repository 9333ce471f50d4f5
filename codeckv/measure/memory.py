"""Cache memory at a long context: archive vs resident bytes, materialized view vs materialization-free.

    rows = memory_table(loaded, ["jpeg-k8-int8", "turbo-4"], context=4096)

Each tier prefills `context` corpus tokens and decodes a few more, once with the
materialized cache (archive + decoded view) and once materialization-free
(attention on the stored codes), and reports the footprint of each (design.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from codeckv.cache import make_cache
from codeckv.measure.corpus import corpus_windows
from codeckv.models import LoadedModel
from codeckv.tiers import as_tier


@dataclass
class MemoryRow:
    tier: str
    mode: str  # "materialized" or "materialization-free"
    tokens: int
    archive_bytes: int
    resident_bytes: int
    bf16_bytes: int
    resident_over_archive: float


@torch.inference_mode()
def memory_table(loaded: LoadedModel, tiers: list[str], context: int = 4096, decode_steps: int = 16,
                 progress: Callable[[str], None] | None = None) -> list[MemoryRow]:
    """Footprint of each tier in both modes after a `context`-token prefill and `decode_steps` decode steps.

    progress(message) is called after each (tier, mode) run.
    """
    ids = corpus_windows(loaded.tokenizer, 1, context + decode_steps)[0].to(loaded.model.device)
    rows = []
    for tier in tiers:
        for free in (False,) if as_tier(tier).joint else (False, True):  # PCA tiers have no materialization-free mode
            cache = make_cache(loaded, tier, materialization_free=free)
            loaded.model(ids[None, :context], cache=cache)
            for t in range(context, context + decode_steps):
                loaded.model(ids[None, t : t + 1], cache=cache)
            fp = cache.footprint()
            mode = "materialization-free" if free else "materialized"
            rows.append(MemoryRow(tier, mode, context + decode_steps, fp.archive_bytes, fp.resident_bytes,
                                  fp.bf16_bytes, fp.resident_bytes / fp.archive_bytes))
            if progress is not None:
                progress(f"{as_tier(tier).name} {mode}")
    return rows
