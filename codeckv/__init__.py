"""codeckv: KV-cache codecs as a transformers Cache backend, with honest measurements.

    from codeckv import TIERS, load_model, make_cache
    loaded = load_model()                                   # embedded smollm2-135m, offline
    cache = make_cache(loaded.model.config, "turbo-4")      # a CodecCache (a DynamicCache for "native")
    loaded.model.generate(input_ids, cache=cache, max_new_tokens=64)
    print(cache.footprint().ratio)                          # archive bytes / bf16 cache bytes
    cache = make_cache(loaded, "pca-8x")                    # PCA tiers: calibrated once per model, cached on disk
    cache = make_cache(loaded, "turbo-4", per_layer={1: "int8"})   # a tier per layer (codeckv/cache/schedule.py)
    cache.save("chat.kvc", token_ids, loaded)               # a versioned safetensors file (cache/saved_format.py)
    saved = load_cache("chat.kvc", loaded)                  # .cache goes on where it was saved, .token_ids

The names below are imported on first use (PEP 562), so that `kernels`, which reads the codecs'
row layouts from `codeckv.codecs.layout`, can be imported without importing the cache that uses it.
"""

import importlib

__version__ = "0.1.0"  # the one source: pyproject.toml reads it, `codeckv --version` prints it

_HOMES = {
    "Calibration": "codeckv.cache.calibration",
    "calibrate": "codeckv.cache.calibration",
    "calibration_for": "codeckv.cache.calibration",
    "CodecCache": "codeckv.cache.codec_cache",
    "footprint": "codeckv.cache.codec_cache",
    "make_cache": "codeckv.cache.codec_cache",
    "steady_state_ratio": "codeckv.cache.codec_cache",
    "DCT": "codeckv.codecs",
    "Delta": "codeckv.codecs",
    "Encoded": "codeckv.codecs",
    "GroupQuant": "codeckv.codecs",
    "LloydMaxQuant": "codeckv.codecs",
    "Rotation": "codeckv.codecs",
    "Footprint": "codeckv.cache.footprint",
    "CodecLayer": "codeckv.cache.layers",
    "CodedLayer": "codeckv.cache.coded_layer",
    "DEFAULT_MODEL": "codeckv.models",
    "LoadedModel": "codeckv.loaded",
    "ModelUnavailableError": "codeckv.models",
    "load_model": "codeckv.models",
    "StackedCache": "codeckv.cache.stacked",
    "TIERS": "codeckv.tiers",
    "Tier": "codeckv.tiers",
    "as_tier": "codeckv.tiers",
    "custom_tier": "codeckv.custom_tier",
    "get_tier": "codeckv.tiers",
    "SavedCache": "codeckv.cache.saved_format",
    "SavedCacheError": "codeckv.cache.saved_format",
    "load_cache": "codeckv.cache.saved_load",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'codeckv' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
