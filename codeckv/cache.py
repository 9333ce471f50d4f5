"""CodecCache: a real `transformers` Cache whose full-attention layers store KV through a codec tier.

    cache = CodecCache.from_config(model.config, "turbo-4")
    model.generate(input_ids, cache=cache, max_new_tokens=64)
    cache.footprint()          # archive / resident / bf16-reference bytes

One `CodecLayer` per full-attention layer; sliding-window, linear-attention and
other layers keep their native transformers layer (hybrid models such as Gemma 3).

How a CodecLayer holds its tokens, in order along the sequence:

    [ keep_first sinks | archived blocks (codec) | raw tail: incomplete block + keep_recent window ]
      full precision     encoded once, never         full precision
                         rewritten (causal safety)

Each forward attends its own new tokens at full precision (as a real prefill does);
at the start of the next update every complete block that left the recent window is
encoded, appended to the archive and decoded once into a preallocated, capacity-
doubling view that attention reads. A decode step therefore costs O(one block):
no full-length concatenation or re-decode per step.

The cache is for inference: its buffers are inference-mode tensors.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, Cache, DynamicLayer, get_layer_types_and_kwargs

from codeckv.archive import Archive
from codeckv.tiers import Tier, get_tier

MIN_ARCHIVE_TOKENS = 8


@dataclass
class LayerFootprint:
    """Bytes one layer holds for its tokens (K and V together)."""

    layer: int
    kind: str  # "codec", or the class name of a native layer
    full_attention: bool  # counted in the totals; other native layers (sliding, linear) are counted apart
    tokens: int
    archive_bytes: int  # everything a codec cache must keep: codes, scales, zeros, anchors, raw tokens
    resident_bytes: int  # archive + materialized view + capacity slack: what is really allocated
    bf16_bytes: int  # a bf16 native cache of the same tokens: 2 x B x H x S x D x 2


@dataclass
class Footprint:
    """Cache-wide bytes, split into codec-carrying layers and native-only layers (design.md)."""

    layers: list[LayerFootprint] = field(default_factory=list)

    def _sum(self, attr: str, full_attention: bool) -> int:
        return sum(getattr(f, attr) for f in self.layers if f.full_attention == full_attention)

    @property
    def archive_bytes(self) -> int:
        return self._sum("archive_bytes", True)

    @property
    def resident_bytes(self) -> int:
        return self._sum("resident_bytes", True)

    @property
    def bf16_bytes(self) -> int:
        return self._sum("bf16_bytes", True)

    @property
    def native_layer_bytes(self) -> int:
        """Bytes held by layers that are not full attention and keep their native cache (sliding, linear)."""
        return self._sum("resident_bytes", False)

    @property
    def ratio(self) -> float:
        """Archive bytes of the codec layers as a fraction of a bf16 cache of the same tokens."""
        return self.archive_bytes / self.bf16_bytes if self.bf16_bytes else float("nan")


class CodecLayer(DynamicLayer):
    """One full-attention layer whose KV goes through `tier`'s key and value codecs."""

    is_compileable = False
    is_croppable = True

    def __init__(self, tier: Tier) -> None:
        super().__init__()
        if tier.key is None or tier.value is None:
            raise ValueError(f"tier '{tier.name}' has no codec; native layers use transformers' DynamicLayer")
        self.tier = tier
        # Tokens archived at a time: whole codec blocks, and at least MIN_ARCHIVE_TOKENS so that per-token
        # codecs (int8) encode once per 8 steps instead of paying an encode/decode call on every step.
        self.unit = math.lcm(tier.key.block_tokens, tier.value.block_tokens, MIN_ARCHIVE_TOKENS)
        self._reset_state()

    def _reset_state(self) -> None:
        self.length = 0  # tokens held
        self.archived_upto = self.tier.keep_first  # tokens [keep_first, archived_upto) are archived
        self.archive_k, self.archive_v = Archive(), Archive()
        self._view_k: torch.Tensor | None = None  # (B, H, capacity, D): sinks, decoded archive, raw tail
        self._view_v: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        self.is_initialized = True

    @torch.inference_mode()
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Archive what became archivable, append the new (B, H, T, D) states raw, return the (B, H, S, D) views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.flush()
        new = key_states.shape[2]
        self._ensure_capacity(key_states, self.length + new)
        self._view_k[:, :, self.length : self.length + new] = key_states
        self._view_v[:, :, self.length : self.length + new] = value_states
        self.length += new
        self.keys, self.values = self._view_k[:, :, : self.length], self._view_v[:, :, : self.length]
        return self.keys, self.values

    @torch.inference_mode()
    def flush(self) -> None:
        """Encode every complete block that is neither a sink nor in the recent window, then decode it into the view."""
        count = self._archivable()
        if count <= 0:
            return
        span = slice(self.archived_upto, self.archived_upto + count)
        for codec, archive, view in (
            (self.tier.key, self.archive_k, self._view_k),
            (self.tier.value, self.archive_v, self._view_v),
        ):
            encoded = codec.encode(view[:, :, span])
            archive.append(encoded)
            view[:, :, span] = codec.decode(encoded)
        self.archived_upto += count

    def _archivable(self) -> int:
        """Tokens to archive now: whole units after the archive that are neither sinks nor in the recent window."""
        end = self.length - self.tier.keep_recent
        return max((end - self.archived_upto) // self.unit * self.unit, 0)

    def _shorten(self, tokens_to_remove: int) -> bool:
        """Validate a crop (5.24: a negative count) and shorten `length`; False when there is nothing to do."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop({tokens_to_remove}): pass a negative number of tokens to remove")
        if tokens_to_remove == 0 or not self.is_initialized:
            return False
        self.length = max(self.length + tokens_to_remove, 0)
        return True

    def _archived_after_crop(self) -> int:
        """Archived tokens that stay after a crop: the whole units before the new end."""
        return max(self.length - self.tier.keep_first, 0) // self.unit * self.unit

    def _ensure_capacity(self, like: torch.Tensor, needed: int) -> None:
        capacity = 0 if self._view_k is None else self._view_k.shape[2]
        if needed <= capacity:
            return
        capacity = max(needed, 2 * capacity, 64)
        b, h, _, d = like.shape
        grown_k = like.new_empty((b, h, capacity, d))
        grown_v = like.new_empty((b, h, capacity, self._head_dim_v(like)))
        if self._view_k is not None:
            grown_k[:, :, : self.length] = self._view_k[:, :, : self.length]
            grown_v[:, :, : self.length] = self._view_v[:, :, : self.length]
        self._view_k, self._view_v = grown_k, grown_v

    def _head_dim_v(self, like: torch.Tensor) -> int:
        return like.shape[3] if self._view_v is None else self._view_v.shape[3]

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.keys = self.values = None
        self.is_initialized = False
        self._reset_state()

    @torch.inference_mode()
    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last -tokens_to_remove tokens (transformers 5.24: a negative count).

        Archived blocks past the new end are dropped; tokens of a partly cropped block return to the raw
        tail with their decoded values (exact for lossless tiers) and are archived again once complete.
        """
        if not self._shorten(tokens_to_remove):
            return
        kept = self._archived_after_crop()
        if self.tier.keep_first + kept < self.archived_upto:
            self.archived_upto = self.tier.keep_first + kept
            self.archive_k.truncate(kept)
            self.archive_v.truncate(kept)
        self.keys, self.values = self._view_k[:, :, : self.length], self._view_v[:, :, : self.length]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    @torch.inference_mode()
    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._view_k is None:
            return
        indices = indices.to(self._view_k.device)
        self._view_k, self._view_v = self._view_k.index_select(0, indices), self._view_v.index_select(0, indices)
        self.archive_k.select_batch(indices)
        self.archive_v.select_batch(indices)
        self.keys, self.values = self._view_k[:, :, : self.length], self._view_v[:, :, : self.length]

    @torch.inference_mode()
    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._view_k is None:
            return
        self._view_k = self._view_k.repeat_interleave(repeats, dim=0)
        self._view_v = self._view_v.repeat_interleave(repeats, dim=0)
        self.archive_k.repeat_batch(repeats)
        self.archive_v.repeat_batch(repeats)
        self.keys, self.values = self._view_k[:, :, : self.length], self._view_v[:, :, : self.length]

    def footprint(self, layer: int) -> LayerFootprint:
        """Bytes for the tokens held, after archiving whatever is archivable (design.md definitions)."""
        if self._view_k is None:
            return LayerFootprint(layer, "codec", True, 0, 0, 0, 0)
        self.flush()
        b, h, _, d = self._view_k.shape
        raw_tokens = self.length - self.archive_k.tokens
        raw_bytes = raw_tokens * b * h * (d + self._view_v.shape[3]) * self._view_k.element_size()
        archive = self.archive_k.nbytes + self.archive_v.nbytes + raw_bytes
        view = (self._view_k.numel() + self._view_v.numel()) * self._view_k.element_size()
        resident = self.archive_k.allocated_bytes + self.archive_v.allocated_bytes + view
        bf16 = self.length * b * h * (d + self._view_v.shape[3]) * 2
        return LayerFootprint(layer, "codec", True, self.length, archive, resident, bf16)


class CodecCache(Cache):
    """A transformers Cache with codec layers on full-attention layers and native layers elsewhere."""

    def __init__(self, layers: list, tier: Tier) -> None:
        super().__init__(layers=layers)
        self.tier = tier

    @classmethod
    def from_config(cls, config, tier: Tier | str, **overrides) -> CodecCache:
        """Build the cache for a model config; `overrides` replace tier fields (e.g. keep_recent=32).

        With materialization_free=True the codec layers keep no decoded view and attention reads the stored
        codes: call `codeckv.attention.use_codec_attention(model)` once so the model routes attention there.
        """
        tier = get_tier(tier) if isinstance(tier, str) else tier
        if overrides:
            tier = dataclasses.replace(tier, **overrides)
        layer_types, layer_kwargs = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
        native = tier.key is None
        codec_layer = CodecLayer
        if tier.materialization_free:
            from codeckv.attention import CodedLayer  # imports this module: bound here, not at the top

            codec_layer = CodedLayer
        layers = [
            codec_layer(tier) if kind == "full_attention" and not native else DYNAMIC_LAYER_TYPE_MAPPING[kind](**kwargs)
            for kind, kwargs in zip(layer_types, layer_kwargs)
        ]
        return cls(layers, tier)

    def flush(self) -> None:
        """Archive now what the next update would archive (e.g. a prompt right after its prefill, to time it)."""
        for layer in self.layers:
            if isinstance(layer, CodecLayer):
                layer.flush()

    def footprint(self) -> Footprint:
        """Archive, resident and bf16-reference bytes, per layer and in total."""
        return footprint(self)


def footprint(cache: Cache) -> Footprint:
    """Bytes held by any cache: a CodecCache, or a native DynamicCache (whose archive is what it holds)."""
    result = Footprint()
    for index, layer in enumerate(cache.layers):
        if isinstance(layer, CodecLayer):
            result.layers.append(layer.footprint(index))
        else:
            result.layers.append(_native_footprint(index, layer))
    return result


def _native_footprint(index: int, layer) -> LayerFootprint:
    """A native layer: what it holds is both its archive and its resident bytes."""
    kind = type(layer).__name__
    full_attention = type(layer) is DynamicLayer
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    if keys is None or keys.numel() == 0:
        return LayerFootprint(index, kind, full_attention, 0, 0, 0, 0)
    held = keys.numel() * keys.element_size() + values.numel() * values.element_size()
    bf16 = (keys.numel() + values.numel()) * 2
    return LayerFootprint(index, kind, full_attention, keys.shape[2], held, held, bf16)
