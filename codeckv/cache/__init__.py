"""The transformers Cache backend: codec layers that archive KV through a tier, and what a cache holds.

    from codeckv.cache import make_cache, CodecCache, footprint, held_bytes
    cache = make_cache(model.config, "turbo-4")

Modules, each one concept: codec_cache (CodecCache, make_cache), layers / coded_layer / pca_layer (a decoded
view, attention on the codes, a PCA tier's chunks), archive and flush (append-only blocks, batched
archiving), footprint (bytes), reasons (why a view), schedule (a tier per layer), calibration (a PCA tier's per-model
coder), attention and stacked (the attention function, several caches in one batch), kernel_ops (the one
door to kernels/), saved_format / saved (the .kvc file). They import codecs and tiers, never the layers
above (measure, figures, serve, cli).
"""

from codeckv.cache.codec_cache import (
    CODES,
    SHORT_VIEW,
    VIEW,
    CodecCache,
    footprint,
    held_bytes,
    make_cache,
    steady_state_ratio,
)
from codeckv.cache.reasons import view_reason

__all__ = [
    "CODES",
    "SHORT_VIEW",
    "VIEW",
    "CodecCache",
    "footprint",
    "held_bytes",
    "make_cache",
    "steady_state_ratio",
    "view_reason",
]
