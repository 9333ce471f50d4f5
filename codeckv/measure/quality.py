"""Per-tier quality on the embedded corpus: archive bytes vs bf16, decode NLL and ΔNLL% (design.md).

    rows = quality_table(loaded, ["png", "turbo-4"], windows=4, length=512)

Native and every tier run on the same windows with the same protocol (measure/nll.py).
A window of `length` tokens is followed by one more token, the target of the last
prediction, so the cache holds exactly `length` tokens when its footprint is read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from codeckv.cache import footprint, make_cache
from codeckv.layers import CodecLayer
from codeckv.measure.corpus import corpus_windows
from codeckv.measure.nll import decode_nll, delta_percent
from codeckv.models import LoadedModel
from codeckv.tiers import Tier, as_tier, get_tier


@dataclass
class QualityRow:
    tier: str
    description: str
    archive_bytes: int  # codec-carrying layers holding `length` tokens (mean over windows)
    bf16_bytes: int  # a bf16 native cache of the same tokens
    ratio_vs_bf16: float
    nll: float
    delta_nll_pct: float
    entropy_coded_bytes: int | None  # lossless tiers: the archive after byte shuffling + zstd (None otherwise)
    windows: int
    tokens_per_window: int


def quality_table(
    loaded: LoadedModel,
    tiers: list[str | Tier],
    windows: int = 4,
    length: int = 512,
    progress: Callable[[str], None] | None = None,
) -> list[QualityRow]:
    """Measure native first, then each tier, on the first `windows` corpus windows of `length` tokens."""
    data = corpus_windows(loaded.tokenizer, windows, length + 1)  # + the last target
    config = loaded.model.config
    tiers = [as_tier(t) for t in tiers]
    if not any(t.is_native for t in tiers):
        tiers = [get_tier("native"), *tiers]
    rows, native_nll = [], None
    for tier in tiers:
        caches = []

        def fresh_cache(tier=tier, caches=caches):
            cache = make_cache(config, tier)
            caches.append(cache)
            return cache

        nlls, archive, bf16, entropy = [], 0, 0, 0
        for index, window in enumerate(data):
            nlls.append(decode_nll(loaded.model, window, fresh_cache).mean)
            fp = footprint(caches[-1])
            archive, bf16 = archive + fp.archive_bytes, bf16 + fp.bf16_bytes
            entropy += entropy_coded_bytes(caches[-1]) or 0
            if progress:
                progress(f"{tier.name}: window {index + 1}/{windows} done")
        nll = sum(nlls) / len(nlls)
        native_nll = nll if tier.is_native else native_nll
        rows.append(
            QualityRow(
                tier=tier.name,
                description=tier.description,
                archive_bytes=archive // windows,
                bf16_bytes=bf16 // windows,
                ratio_vs_bf16=archive / bf16,
                nll=nll,
                delta_nll_pct=delta_percent(nll, native_nll),
                entropy_coded_bytes=entropy // windows if entropy else None,
                windows=windows,
                tokens_per_window=length,
            )
        )
    return rows


def entropy_coded_bytes(cache) -> int | None:
    """Bytes of a lossless cache's archive after entropy coding, raw tokens included; None for other caches.

    Only codecs that know their entropy-coded size (Delta: byte shuffle + zstd) report one.
    """
    total = 0
    for layer in getattr(cache, "layers", []):
        if not isinstance(layer, CodecLayer):
            continue
        codecs = (layer.tier.key, layer.tier.value)
        if not all(hasattr(c, "entropy_nbytes") for c in codecs):
            return None
        fp = layer.footprint(0)
        coded = layer.archive_k.nbytes + layer.archive_v.nbytes
        total += fp.archive_bytes - coded  # raw sinks / tail, kept as they are
        for codec, archive in zip(codecs, (layer.archive_k, layer.archive_v)):
            if archive.tokens:
                total += codec.entropy_nbytes(archive.encoded())
    return total or None


def as_dicts(rows: list[QualityRow]) -> list[dict]:
    return [asdict(r) for r in rows]
