"""Materialization-free codec attention: attention reads the archived codes, no decoded view is kept.

    cache = CodecCache.from_config(model.config, "jpeg-k8-int8", materialization_free=True)
    use_codec_attention(model)          # the "codeckv" attention function; plain SDPA for every other layer
    model.generate(input_ids, cache=cache, max_new_tokens=64)

A `CodedLayer` holds the same tokens as a CodecLayer, in the same order,

    [ keep_first raw sinks | archived blocks (codec) | raw tail: incomplete block + keep_recent window ]

and archives them at the same moments, but never decodes the archive into a view. Its update()
returns shape-only "meta" tensors tagged with the layer; `codec_attention`, registered in
transformers' AttentionInterface, recognizes the tag and runs kernels.decode_attention on the
layer's segments (Triton on CUDA, the chunked torch reference elsewhere). Untagged keys (native
layers, sliding-window layers, a materialized CodecLayer) go to transformers' SDPA unchanged.
Resident bytes: the archive (tight buffers, growth slack <= 1/32) plus the raw tokens it holds.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from codeckv.archive import Archive
from codeckv.cache import CodecCache, CodecLayer, LayerFootprint
from codeckv.tiers import Tier
from kernels.codes import slice_encoded
from kernels.ops import Coded, Raw, Segment, decode_attention

ATTENTION = "codeckv"  # the attn_implementation name
TAG = "codeckv_layer"  # attribute of the meta tensors a CodedLayer returns


def _cat(pair: tuple[torch.Tensor, torch.Tensor] | None, k: torch.Tensor, v: torch.Tensor):
    """pair + (k, v) along the sequence, as new exactly-sized tensors."""
    if pair is None:
        return k.clone(), v.clone()
    return torch.cat([pair[0], k], dim=2), torch.cat([pair[1], v], dim=2)


class CodedLayer(CodecLayer):
    """A CodecLayer without the decoded view: attention runs on the stored codes (module docstring)."""

    def _reset_state(self) -> None:
        self.length = 0  # tokens held
        self.archived_upto = self.tier.keep_first  # tokens [keep_first, archived_upto) are archived
        self.archive_k, self.archive_v = Archive(tight=True), Archive(tight=True)
        self._sinks: tuple[torch.Tensor, torch.Tensor] | None = None  # (B, H, <= keep_first, D) raw
        self._tail: tuple[torch.Tensor, torch.Tensor] | None = None  # tokens [archived_upto, length) raw

    @torch.inference_mode()
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Archive what became archivable, keep the new (B, H, T, D) states raw, return tagged meta tensors."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.flush()
        new = key_states.shape[2]
        sinks = min(max(self.tier.keep_first - self.length, 0), new)
        if sinks:
            self._sinks = _cat(self._sinks, key_states[:, :, :sinks], value_states[:, :, :sinks])
        if sinks < new:
            self._tail = _cat(self._tail, key_states[:, :, sinks:], value_states[:, :, sinks:])
        self.length += new
        self.keys, self.values = self._shapes(key_states, value_states)
        keys, values = self._shapes(key_states, value_states)
        setattr(keys, TAG, self)
        setattr(values, TAG, self)
        return keys, values

    def _shapes(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, H, length, D) meta tensors: shapes for whoever asks, no storage."""
        b, h, _, d = key_states.shape
        keys = torch.empty((b, h, self.length, d), dtype=key_states.dtype, device="meta")
        values = torch.empty((b, h, self.length, value_states.shape[3]), dtype=value_states.dtype, device="meta")
        return keys, values

    @torch.inference_mode()
    def flush(self) -> None:
        """Encode every complete block of the tail that left the recent window; keep the rest raw."""
        count = self._archivable()
        if count <= 0:
            return
        k, v = self._tail
        self.archive_k.append(self.tier.key.encode(k[:, :, :count]))
        self.archive_v.append(self.tier.value.encode(v[:, :, :count]))
        self._tail = (k[:, :, count:].clone(), v[:, :, count:].clone())
        self.archived_upto += count

    def segments(self) -> list[Segment]:
        """The tokens in order as decode_attention segments: sinks, archive, tail (empty ones left out)."""
        segments: list[Segment] = []
        if self._sinks is not None:
            segments.append(Raw(*self._sinks))
        if self.archive_k.tokens:
            segments.append(
                Coded(self.tier.key, self.archive_k.encoded(), self.tier.value, self.archive_v.encoded())
            )
        if self._tail is not None and self._tail[0].shape[2]:
            segments.append(Raw(*self._tail))
        return segments

    def attend(self, query: torch.Tensor, mask: torch.Tensor | None, scale: float | None) -> torch.Tensor:
        """Attention of query (B, Hq, T, D) on every held token: (B, Hq, T, Dv).

        mask: transformers' (B, 1, T, S) mask, or None = causal (the last T tokens are the queries).
        """
        t = query.shape[2]
        if mask is None and t > 1:
            pos = torch.arange(self.length, device=query.device)
            mask = (pos[None, :] <= pos[self.length - t :, None])[None, None]  # (1, 1, T, S)
        return decode_attention(query, self.segments(), scale, mask)

    def raw(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every held token as (B, H, S, D) tensors; only valid while nothing is archived (all tokens are raw)."""
        if self.archive_k.tokens:
            raise ValueError("raw(): this layer has archived tokens; use attend()")
        pairs = [p for p in (self._sinks, self._tail) if p is not None]
        if len(pairs) == 1:
            return pairs[0]
        return torch.cat([p[0] for p in pairs], dim=2), torch.cat([p[1] for p in pairs], dim=2)

    @torch.inference_mode()
    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last -tokens_to_remove tokens; a partly cropped block goes back to the raw tail, decoded."""
        if not self._shorten(tokens_to_remove):
            return
        keep_first = self.tier.keep_first
        if self._sinks is not None:
            self._sinks = tuple(t[:, :, : min(self.length, keep_first)] for t in self._sinks)
        kept = self._archived_after_crop()
        tail = [] if self._tail is None else [self._tail]
        if keep_first + kept < self.archived_upto:
            archived = self.archived_upto - keep_first
            back = [
                codec.decode(slice_encoded(archive.encoded(), kept, archived))
                for codec, archive in ((self.tier.key, self.archive_k), (self.tier.value, self.archive_v))
            ]
            tail = [tuple(back)] + tail
            self.archive_k.truncate(kept)
            self.archive_v.truncate(kept)
            self.archived_upto = keep_first + kept
        if tail:
            held = max(self.length - self.archived_upto, 0)
            self._tail = tuple(torch.cat([p[i] for p in tail], dim=2)[:, :, :held].clone() for i in (0, 1))

    @torch.inference_mode()
    def batch_select_indices(self, indices: torch.Tensor) -> None:
        for name in ("_sinks", "_tail"):
            pair = getattr(self, name)
            if pair is not None:
                setattr(self, name, tuple(t.index_select(0, indices.to(t.device)) for t in pair))
        self.archive_k.select_batch(indices)
        self.archive_v.select_batch(indices)

    @torch.inference_mode()
    def batch_repeat_interleave(self, repeats: int) -> None:
        for name in ("_sinks", "_tail"):
            pair = getattr(self, name)
            if pair is not None:
                setattr(self, name, tuple(t.repeat_interleave(repeats, dim=0) for t in pair))
        self.archive_k.repeat_batch(repeats)
        self.archive_v.repeat_batch(repeats)

    def footprint(self, layer: int) -> LayerFootprint:
        """Bytes for the tokens held (design.md definitions); resident = archive buffers + raw tokens."""
        if not self.is_initialized or self.length == 0:
            return LayerFootprint(layer, "codec", True, 0, 0, 0, 0)
        self.flush()
        pairs = [p for p in (self._sinks, self._tail) if p is not None]
        raw_bytes = sum(t.numel() * t.element_size() for p in pairs for t in p)
        archive = self.archive_k.nbytes + self.archive_v.nbytes + raw_bytes
        resident = self.archive_k.allocated_bytes + self.archive_v.allocated_bytes + raw_bytes
        b, h, _, d = self.keys.shape
        bf16 = self.length * b * h * (d + self.values.shape[3]) * 2
        return LayerFootprint(layer, "codec", True, self.length, archive, resident, bf16)


def codec_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: stored codes for a CodedLayer's tagged keys, SDPA for anything else."""
    layer = getattr(key, TAG, None)
    if layer is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if kwargs.get("softcap") is not None or kwargs.get("sliding_window") or dropout:
        raise ValueError("codeckv attention: softcap, sliding windows and dropout are not supported on codec layers")
    if not layer.archive_k.tokens:  # nothing archived yet (a first prefill): plain SDPA on the raw tokens
        keys, values = layer.raw()
        return sdpa_attention_forward(module, query, keys, values, attention_mask, dropout, scaling, **kwargs)
    out = layer.attend(query, attention_mask, scaling)  # (B, Hq, T, Dv)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register "codeckv" in transformers' attention and mask interfaces (idempotent)."""
    AttentionInterface.register(ATTENTION, codec_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def use_codec_attention(model) -> None:
    """Make `model` attend through codec_attention (safe for any cache: non-codec layers still use SDPA)."""
    register()
    model.set_attn_implementation(ATTENTION)


def materialization_free_cache(config, tier: Tier | str, **overrides) -> CodecCache:
    """CodecCache.from_config(..., materialization_free=True): CodedLayer on every codec layer."""
    return CodecCache.from_config(config, tier, materialization_free=True, **overrides)
