"""One native prefill serving every tier: under the "once" protocol each tier's cache is a function of it.

    prefill = shared_prefill(loaded, ids)           # (1, S) ids: native DynamicCache + each layer's queries
    cache = prefill.cache_for(TIERS["snapkv-50"])   # pressed once with the captured queries, as kvpress does
    cache = prefill.cache_for(TIERS["turbo-4"])     # converted: the same archive as prefilling through it
    cache = prefill.cache_for(TIERS["native"])      # a copy of the native cache
    prefill.logits                                  # (B, vocab) the prefill's prediction of the next token

A codec stores what native computed (CodecCache.from_cache); a press scores the prefill's keys with the queries the
attention read, captured during the native prefill (codeckv.cache.attention.captured_queries), after that attention,
exactly as a press does when the context is prefilled through its own cache in one forward (presses/base.py: the
"once" protocol). So a grid of tiers pays one prefill per context, then each tier only its conversion. The captured
queries cost Hq / (2 H) of the native cache again (GQA: 1.5x on SmolLM2, 3.5x on Qwen2.5-Coder-0.5B).
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from transformers import Cache, DynamicCache

from codeckv.cache import CodecCache
from codeckv.cache.attention import captured_queries, use_codec_attention
from codeckv.cache.calibration import calibration_for
from codeckv.cache.rope import attention_modules, rope_at
from codeckv.loaded import LoadedModel
from codeckv.tiers import Tier


@dataclass
class SharedPrefill:
    """A context prefilled natively once, with what every tier's cache is built from."""

    loaded: LoadedModel
    ids: torch.Tensor  # (B, S) the context
    native: DynamicCache  # holding the context; left as it is by cache_for
    queries: dict[int, torch.Tensor]  # layer index -> (B, Hq, S, D) the queries its attention read (RoPE applied)
    rope: dict  # layer index -> its rotary embedding (cache/rope.py RotaryAt, None without one), for the presses
    logits: torch.Tensor  # (B, vocab) float32, the prediction of the token after the context

    def cache_for(self, tier: Tier, materialization_free: bool | None = None) -> Cache:
        """A fresh cache of `tier` holding the context, as if the context had been prefilled through it in one forward
        ("once"); native's own cache stays untouched."""
        if tier.is_native:
            return copy.deepcopy(self.native)
        return CodecCache.from_cache(self.native, tier, materialization_free, calibration_for(self.loaded, tier),
                                     queries=self.queries, rope=self.rope)


@torch.inference_mode()
def shared_prefill(loaded: LoadedModel, ids: torch.Tensor, capture_queries: bool = True) -> SharedPrefill:
    """Prefill `ids` (B, S) natively in one forward, capturing every layer's queries (module docstring); without
    `capture_queries` (no press will be built from it) none are kept."""
    use_codec_attention(loaded.model)  # the attention function that captures the queries
    native = DynamicCache(config=loaded.model.config)
    with captured_queries() if capture_queries else nullcontext({}) as queries:
        logits = loaded.model(input_ids=ids, cache=native, use_cache=True, logits_to_keep=1).logits[:, -1].float()
    rope = {index: rope_at(module) for index, module in attention_modules(loaded.model).items()}
    return SharedPrefill(loaded, ids, native, dict(queries), rope, logits)
