"""codeckv: KV-cache codecs as a transformers Cache backend, with honest measurements.

    from codeckv import CodecCache, TIERS, load_model
    loaded = load_model()                                   # embedded smollm2-135m, offline
    cache = CodecCache.from_config(loaded.model.config, "turbo-4")
    loaded.model.generate(input_ids, cache=cache, max_new_tokens=64)
    print(cache.footprint().ratio)                          # archive bytes / bf16 cache bytes
"""

from codeckv.cache import CodecCache, CodecLayer, Footprint, footprint
from codeckv.codecs import DCT, Delta, Encoded, GroupQuant, LloydMaxQuant, Rotation
from codeckv.models import DEFAULT_MODEL, LoadedModel, ModelUnavailableError, load_model
from codeckv.tiers import TIERS, Tier, custom_tier, get_tier

__all__ = [
    "DCT",
    "DEFAULT_MODEL",
    "TIERS",
    "CodecCache",
    "CodecLayer",
    "Delta",
    "Encoded",
    "Footprint",
    "GroupQuant",
    "LoadedModel",
    "LloydMaxQuant",
    "ModelUnavailableError",
    "Rotation",
    "Tier",
    "custom_tier",
    "footprint",
    "get_tier",
    "load_model",
]
