"""Codec layers for hybrid layers: a linear-attention state (Mamba, short convolution) beside attention's KV.

Falcon-H1's layers run a Mamba mixer and attention side by side, so transformers gives each one cache layer holding
both (LinearAttentionAndFullAttentionLayer, or ...AndSlidingWindowAttentionLayer). Here the linear-attention state
stays exactly as transformers keeps it (LinearAttentionLayer: fixed-size states, nothing to compress), and the keys
and values go through the tier like any codec layer's (CodecLayer, or CodedLayer on the codes). transformers tells
the two apart by their lazy initialization: two positional tensors are the KV, keywords a linear state.
"""

from __future__ import annotations

from transformers.cache_utils import LinearAttentionLayer

from codeckv.cache.coded_layer import CodedLayer
from codeckv.cache.layers import CodecLayer

HYBRID = ("hybrid", "hybrid_sliding")  # transformers' layer types holding a linear state beside attention's KV


def _hybrid(codec_class: type) -> type:
    """A layer class holding transformers' linear-attention state beside a `codec_class` layer's keys and values."""

    class Hybrid(LinearAttentionLayer, codec_class):
        def __init__(self, *args, number_of_states: int = 1, **kwargs) -> None:
            """codec_class's arguments; number_of_states: the linear states transformers asks the layer for."""
            codec_class.__init__(self, *args, **kwargs)
            LinearAttentionLayer.__init__(self, number_of_states=number_of_states)

        def lazy_initialization(self, *args, **kwargs) -> None:
            if len(args) == 2 and not kwargs:  # the keys and values of update()
                codec_class.lazy_initialization(self, *args)
            else:  # a conv or recurrent state
                LinearAttentionLayer.lazy_initialization(self, *args, **kwargs)

        def reset(self) -> None:
            LinearAttentionLayer.reset(self)
            codec_class.reset(self)

        def reorder_cache(self, beam_idx) -> None:
            LinearAttentionLayer.reorder_cache(self, beam_idx)
            codec_class.reorder_cache(self, beam_idx)

        def crop(self, tokens_to_remove: int) -> None:
            LinearAttentionLayer.crop(self, tokens_to_remove)
            codec_class.crop(self, tokens_to_remove)

        def get_max_length(self) -> int:
            return codec_class.get_max_length(self)

    Hybrid.__name__ = Hybrid.__qualname__ = f"Hybrid{codec_class.__name__}"
    return Hybrid


HybridCodecLayer = _hybrid(CodecLayer)
HybridCodedLayer = _hybrid(CodedLayer)
