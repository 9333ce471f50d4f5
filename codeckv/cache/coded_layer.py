"""CodedLayer: a CodecLayer (codeckv/cache/layers.py) without the decoded view; attention runs on the stored codes.

Its update() returns shape-only "meta" tensors tagged with the layer (TAG); codeckv.cache.attention then runs
kernels.decode_attention on its segments (the stored codes, the raw tokens). A short context's decode steps may
read a decoded view instead (`short_view`, up to SHORT_VIEW_TOKENS tokens; never a prefill chunk, never at
rest); docs/architecture.md tabulates when. held_bytes counts it. A layer whose decode steps would read that view
holds a short context raw instead (its own N is SHORT_VIEW_TOKENS: codeckv/cache/layers.py, "Raw until N"), so
the view is built only where a smaller raw_until was asked for (a measurement archiving from the start).
"""

from __future__ import annotations

import torch

from codeckv.cache.archive import Archive
from codeckv.cache.footprint import LayerFootprint
from codeckv.cache.kernel_ops import Coded, Raw, Segment, attention_compiled, decode, decode_attention
from codeckv.cache.layer_rest import RawTokens
from codeckv.cache.layers import SHORT_VIEW_TOKENS, CodecLayer
from codeckv.cache.pressed_layer import gather_tokens
from codeckv.codecs.base import Encoded, slice_encoded
from codeckv.tiers import Tier

TAG = "codeckv_layer"  # attribute of the meta tensors a CodedLayer returns (codeckv.cache.attention reads it)


def _cat(pair: tuple[torch.Tensor, torch.Tensor] | None, k: torch.Tensor, v: torch.Tensor):
    """pair + (k, v) along the sequence, as new exactly-sized tensors."""
    if pair is None:
        return k.clone(), v.clone()
    return torch.cat([pair[0], k], dim=2), torch.cat([pair[1], v], dim=2)


class CodedLayer(CodecLayer):
    """A CodecLayer without the decoded view: attention runs on the stored codes (module docstring).

    short_view: decode steps at a short context read a decoded view (module docstring; make_cache's default
    path asks for it); False = the codes always. raw_until, window: as CodecLayer's.
    """

    def __init__(self, tier: Tier, short_view: bool = False, raw_until: int | None = 0,
                 window: int | None = None) -> None:
        self.short_view = short_view
        super().__init__(tier, raw_until, window)

    def _reads_view(self, key_states: torch.Tensor) -> bool:
        """True when its decode steps would read a short context's view (no compiled kernel reads these codes)."""
        return self.short_view and not self._codes_compiled(key_states)

    def _reset_state(self) -> None:
        self.length = 0  # tokens seen, less those a press evicted: where the next one is stored
        self.first = 0  # position of the first token held (a sliding window dropped the ones before it)
        self._reset_press()  # (a budget presses raw tokens only: its queries are never kept here)
        self._hidden = 0  # held tokens at the front that the current forward's queries do not see (a window)
        self.archived_upto = self.tier.keep_first  # tokens [archive_start, archived_upto) are archived
        self.archive_k, self.archive_v = Archive(tight=True), Archive(tight=True)
        self._sinks: tuple[torch.Tensor, torch.Tensor] | None = None  # (B, H, <= keep_first, D) raw
        self._tail: tuple[torch.Tensor, torch.Tensor] | None = None  # tokens [archived_upto, length) raw
        self._drop_view()

    def _drop_view(self) -> None:
        """Forget the short-context view (module docstring): the codes are read until a decode step rebuilds it."""
        self._view_k = self._view_v = None  # (B, H, capacity, D): sinks, decoded archive, raw tail

    @property
    def on_view(self) -> bool:
        """True while decode steps read the short-context view instead of the codes."""
        return self._view_k is not None

    @property
    def needs_decoded(self) -> bool:
        """flush_layers decodes what it archives only for the short-context view (the codes need no decoding)."""
        return self.on_view

    @torch.inference_mode()
    def compact(self) -> None:
        """At rest: the short-context view (if any) and the archive's capacity slack go."""
        self.flush()
        self._drop_view()
        self._trim_archive()

    def restore(self) -> float:
        """Nothing to rebuild: attention reads the stored codes."""
        return 0.0

    def _raw_tokens(self) -> RawTokens:
        """The sinks and the raw tail as they are held (empty (B, H, 0, D) tensors where there are none)."""
        b, h, _, d = self.keys.shape
        dv = self.values.shape[3]
        none = (torch.empty((b, h, 0, d), dtype=self.dtype, device=self.device),
                torch.empty((b, h, 0, dv), dtype=self.dtype, device=self.device))
        return RawTokens(*(self._sinks or none), *(self._tail or none))

    def _load_raw(self, rest: RawTokens) -> None:
        self._sinks = (rest.sink_keys, rest.sink_values) if rest.sink_keys.shape[2] else None
        self._tail = (rest.tail_keys, rest.tail_values) if rest.tail_keys.shape[2] else None

    @torch.inference_mode()
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Archive what became archivable, keep the new (B, H, T, D) states raw, return tagged meta tensors."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.flush()
        new, held = key_states.shape[2], self.held
        sinks = min(max(self.tier.keep_first - self.length, 0), new)
        if sinks:
            self._sinks = _cat(self._sinks, key_states[:, :, :sinks], value_states[:, :, :sinks])
        if sinks < new:
            self._tail = _cat(self._tail, key_states[:, :, sinks:], value_states[:, :, sinks:])
        if held + new > SHORT_VIEW_TOKENS:
            self._drop_view()
        elif self.on_view:
            self._ensure_capacity(key_states, held + new)
            self._view_k[:, :, held : held + new] = key_states
            self._view_v[:, :, held : held + new] = value_states
        self._hidden = self._visible_from()
        self.length += new
        if (self.short_view and new == 1 and not self.on_view and self.held <= SHORT_VIEW_TOKENS
                and self.archive_k.tokens and not self._codes_compiled(key_states)):
            self._build_view(key_states, value_states)  # a decode step at a short context (module docstring)
        if self.on_view:
            self.keys, self.values = self._view_k[:, :, : self.held], self._view_v[:, :, : self.held]
            return self.keys[:, :, self._hidden :], self.values[:, :, self._hidden :]
        self.keys, self.values = self._shapes(key_states, value_states, self.held)
        keys, values = self._shapes(key_states, value_states, self.held - self._hidden)
        setattr(keys, TAG, self)
        setattr(values, TAG, self)
        return self._pressed_after(new, keys, values)

    def _codes_compiled(self, key_states: torch.Tensor) -> bool:
        """True on the CPU when the compiled kernel reads both sides' codes: no short view is worth its memory."""
        return key_states.device.type == "cpu" and attention_compiled(
            self.tier.key, self.tier.value, key_states.shape[-1])

    def _build_view(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Decode every held token into a new view of the layer's length (later steps grow it: _ensure_capacity)."""
        b, h, _, d = key_states.shape
        self._view_k = key_states.new_empty((b, h, self.held, d))
        self._view_v = value_states.new_empty((b, h, self.held, value_states.shape[3]))
        parts = [self._sinks, self._decode_archive(key_states) if self.archive_k.tokens else None, self._tail]
        at = 0
        for keys, values in (part for part in parts if part is not None):
            self._view_k[:, :, at : at + keys.shape[2]], self._view_v[:, :, at : at + keys.shape[2]] = keys, values
            at += keys.shape[2]

    def _shapes(self, key_states: torch.Tensor, value_states: torch.Tensor,
                tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, H, tokens, D) meta tensors: shapes for whoever asks, no storage."""
        b, h, _, d = key_states.shape
        keys = torch.empty((b, h, tokens, d), dtype=key_states.dtype, device="meta")
        values = torch.empty((b, h, tokens, value_states.shape[3]), dtype=value_states.dtype, device="meta")
        return keys, values

    def _held_changed(self) -> None:
        """keys / values: the view's tokens, or shapes of every held token."""
        if self.on_view:
            super()._held_changed()
        elif self.keys is not None:
            self.keys, self.values = self._shapes(self.keys, self.values, self.held)

    def _chunk(self, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The last `chunk` raw tail tokens (the sinks are apart): (B, H, t, D) keys and values."""
        if self._tail is None:
            return self._shapes(self.keys, self.values, 0)
        start = max(self._tail[0].shape[2] - chunk, 0)
        return self._tail[0][:, :, start:], self._tail[1][:, :, start:]

    def _keep(self, tokens: int, keep: torch.Tensor) -> None:
        """Keep, of the last `tokens` of the tail, those at `keep` (B, H, k); a short view is rebuilt when next read."""
        k, v = self._tail
        end = k.shape[2] - tokens
        self._tail = tuple(torch.cat([t[:, :, :end], gather_tokens(t[:, :, end:], keep)], dim=2) for t in (k, v))
        self._drop_view()

    def _drop_front(self, tokens: int, archived: int) -> None:
        """As CodecLayer's (the archive and any short view), and the raw tail's dropped tokens."""
        super()._drop_front(tokens, archived)
        if tokens > archived and self._tail is not None:
            self._tail = tuple(t[:, :, tokens - archived :].clone() for t in self._tail)

    @torch.inference_mode()
    def adopt(self, key_states: torch.Tensor, value_states: torch.Tensor, first: int = 0) -> None:
        """Take (B, H, S, D) states as this empty layer's tokens from position `first` (a window's: the tokens before
        it dropped); the tail stays a view of them until flush."""
        if self.length:
            raise ValueError("adopt(): the layer already holds tokens")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        sinks = min(self.tier.keep_first, key_states.shape[2])
        if sinks:
            self._sinks = key_states[:, :, :sinks].clone(), value_states[:, :, :sinks].clone()
        if first:
            self.first = self.archived_upto = first
        self.length = first + key_states.shape[2]
        self.keys, self.values = self._shapes(key_states, value_states, self.held)
        if sinks < key_states.shape[2]:
            tail = key_states[:, :, sinks:], value_states[:, :, sinks:]
            self._tail = tail if self._archivable() else (tail[0].clone(), tail[1].clone())  # flush clones the rest

    def _span(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._tail[0][:, :, :count], self._tail[1][:, :, :count]

    def _archived(self, count: int, keys: Encoded, values: Encoded, decoded: tuple | None) -> None:
        """Store the archive of the first `count` tail tokens and keep the rest of the tail raw."""
        self.archive_k.append(keys)
        self.archive_v.append(values)
        k, v = self._tail
        self._tail = (k[:, :, count:].clone(), v[:, :, count:].clone())
        if self.on_view:  # the view holds what attention on the codes would read: the decoded tokens
            span = slice(self.archived_upto - self.first, self.archived_upto - self.first + count)
            self._view_k[:, :, span], self._view_v[:, :, span] = decoded
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

        mask: transformers' (B, 1, T, S) mask over the tokens update() returned, or None = causal (the last T tokens
        are the queries); a window's held tokens before those (`_hidden`) are hidden from every query.
        """
        t, held, hidden = query.shape[2], self.held, self._hidden
        if mask is None and (t > 1 or hidden):
            pos = torch.arange(held, device=query.device)
            mask = ((pos[None, :] <= pos[held - t :, None]) & (pos[None, :] >= hidden))[None, None]  # (1, 1, T, S)
        elif mask is not None and hidden:
            shape = (*mask.shape[:-1], hidden)
            pad = (torch.zeros(shape, dtype=torch.bool, device=mask.device) if mask.dtype == torch.bool
                   else torch.full(shape, float("-inf"), dtype=mask.dtype, device=mask.device))
            mask = torch.cat([pad, mask[..., -(held - hidden) :]], dim=-1)
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
        self._drop_view()
        start = self.archive_start
        if self._sinks is not None:
            self._sinks = tuple(t[:, :, : min(self.length, self.tier.keep_first)] for t in self._sinks)
        kept = self._archived_after_crop()
        tail = [] if self._tail is None else [self._tail]
        if start + kept < self.archived_upto:
            archived = self.archived_upto - start
            back = [
                decode(slice_encoded(archive.encoded(), kept, archived), codec)
                for codec, archive in ((self.tier.key, self.archive_k), (self.tier.value, self.archive_v))
            ]
            tail = [tuple(back)] + tail
            self.archive_k.truncate(kept)
            self.archive_v.truncate(kept)
            self.archived_upto = start + kept
        if tail:
            held = max(self.length - self.archived_upto, 0)
            self._tail = tuple(torch.cat([p[i] for p in tail], dim=2)[:, :, :held].clone() for i in (0, 1))

    @torch.inference_mode()
    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._drop_view()
        for name in ("_sinks", "_tail"):
            pair = getattr(self, name)
            if pair is not None:
                setattr(self, name, tuple(t.index_select(0, indices.to(t.device)) for t in pair))
        self.archive_k.select_batch(indices)
        self.archive_v.select_batch(indices)

    @torch.inference_mode()
    def batch_repeat_interleave(self, repeats: int) -> None:
        self._drop_view()
        for name in ("_sinks", "_tail"):
            pair = getattr(self, name)
            if pair is not None:
                setattr(self, name, tuple(t.repeat_interleave(repeats, dim=0) for t in pair))
        self.archive_k.repeat_batch(repeats)
        self.archive_v.repeat_batch(repeats)

    def held_bytes(self) -> int:
        """Bytes of every tensor this layer owns now: archive buffers, raw sinks and tail, any short view (no flush)."""
        return self._stored()[2] + self._raw_and_view_bytes() + self._press_bytes()

    def _raw_and_view_bytes(self) -> int:
        view = None if self._view_k is None else (self._view_k, self._view_v)
        pairs = [p for p in (self._sinks, self._tail, view) if p is not None]
        return sum(t.numel() * t.element_size() for p in pairs for t in p)

    def footprint(self, layer: int) -> LayerFootprint:
        """Bytes for the tokens held (design.md definitions); resident = archive + raw tokens + any short view."""
        if not self.is_initialized or self.length == 0:
            return LayerFootprint(layer, "codec", True, 0, 0, 0, 0)
        self.flush()
        b, h, _, d = self.keys.shape
        values_per_token = b * h * (d + self.values.shape[3])
        return self._footprint(layer, values_per_token, self.keys.element_size(), self._raw_and_view_bytes())


