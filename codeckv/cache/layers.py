"""The Cache layers of a CodecCache: CodecLayer (a memoized decoded view); CodedLayer (no view at all) is in
codeckv/cache/coded_layer.py.

Both hold a full-attention layer's tokens in the same order and archive them at the same moments:

    [ keep_first sinks | archived blocks (codec) | raw tail: incomplete block + keep_recent window ]
      full precision     encoded once, never         full precision
                         rewritten (causal safety)

Each forward attends its own new tokens at full precision (as a real prefill does); at the start of
the next update every complete unit of tokens that left the recent window is encoded and appended to
the archive. A unit is lcm(key block, value block, MIN_ARCHIVE_TOKENS) tokens.

A sliding-window layer (`window`, the tokens a query sees, itself included) is a KV cache too: it holds its
tokens the same way, without sinks, and drops them from the front as the window moves past them, whole archived
units at a time (a raw token as soon as it leaves), so it holds at most unit - 1 tokens more than transformers'
DynamicSlidingWindowLayer. It answers that layer's mask sizes and returns exactly the tokens that layer would, so
the two can sit side by side in one cache; footprint() counts its bf16 reference as the tokens that layer holds.

Raw until N. A layer that has archived nothing holds its tokens as a native layer does (exact-size, the same
bytes) while it holds fewer than `raw_until` tokens; from then on it archives every complete unit, the first
tokens included, as a layer that archived from the start would. `raw_until=0`, the default, archives from the
first unit (what the measurements score); `raw_until=None` (the Chat's) is the tier's own N (`own_raw_until`):
the first unit on the codes (8 or 32 tokens), SHORT_VIEW_TOKENS for a layer that reads a decoded view (beside
a view an archive pays off only at rest), never for png. docs/architecture.md, "Raw until N", gives the rule
and why. Past N the buffers grow by a fraction of what they hold, with no fixed minimum.

- CodecLayer decodes each archived unit once into the view that attention reads, so a decode step costs O(one
  block): no full-length copy or re-decode per step.
- CodedLayer (codeckv/cache/coded_layer.py) keeps no view but a short context's: attention reads the stored codes.

At rest (`compact()`, e.g. an idle chat session) a layer keeps only what cannot be rebuilt: the archive,
exact-size, and its raw tokens; `restore()`, or the next update, decodes the archive into the view again, bit
for bit as before; `export_state()` / `load_state()` hand that same content to and from a file (all of it in
codeckv/cache/layer_rest.py).

Encoding and decoding go through kernels.encode / kernels.decode: the Triton kernels on CUDA when the
codec's row layout allows, the codec's own torch code elsewhere. Buffers are inference-mode tensors.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch
from transformers.cache_utils import DynamicLayer

from codeckv.cache.archive import Archive, grown_capacity
from codeckv.cache.flush import flush_layers
from codeckv.cache.footprint import LayerFootprint
from codeckv.cache.layer_rest import RawTokens, RestingLayer
from codeckv.cache.pressed_layer import PressedLayer, gather_tokens
from codeckv.codecs.base import Codec, Encoded
from codeckv.tiers import Tier

MIN_ARCHIVE_TOKENS = 8
SHORT_VIEW_TOKENS = 2048  # a short context (module docstring): a layer that would read a view holds it raw up to here


def check_window(window: int | None) -> None:
    """Raise ValueError unless window is None (full attention) or a sliding window of at least 2 tokens."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 2):
        raise ValueError(f"window={window!r} must be None (full attention) or a sliding window of at least 2 tokens")


def view_raw_until(tier: Tier, unit: int) -> int:
    """The own N of a layer of `tier` archiving `unit` tokens at a time that reads a decoded view and whose archive
    pays off (module docstring, "Raw until N"): its first unit, and at least a short context."""
    return max(tier.keep_first + tier.keep_recent + unit, SHORT_VIEW_TOKENS)


@functools.lru_cache(maxsize=64)
def unit_code_bytes(key: Codec, value: Codec, unit: int, head_dims: tuple[int, int], dtype: torch.dtype) -> int:
    """Bytes that one archive unit of one row and head stores, keys and values, codes and metadata: a probe encode
    (these codecs store data-independent sizes; entropy-coded sizes are only reported beside, entropy_nbytes)."""
    generator = torch.Generator().manual_seed(0)
    probe = [torch.randn(1, 1, unit, d, generator=generator).to(dtype) for d in head_dims]
    return key.nbytes(key.encode(probe[0])) + value.nbytes(value.encode(probe[1]))


class CodecLayer(PressedLayer, RestingLayer, DynamicLayer):
    """One full-attention layer whose KV goes through `tier`'s key and value codecs (or a press alone's raw kept
    tokens: cache/pressed_layer.py)."""

    is_compileable = False
    is_croppable = True
    padded = False  # set up for a left-padded batch (set_left_padding): its sinks hold the pad tokens
    variable_length: tuple[str, ...] = ()  # names of export_state tensors whose length differs across layers

    def __init__(self, tier: Tier, raw_until: int | None = 0, window: int | None = None) -> None:
        """raw_until: tokens held raw before the layer archives (0, the default: from the first complete unit); None:
        the tier's own N (module docstring, "Raw until N"), settled at the first update. window: a sliding-window
        layer's window (module docstring); None for full attention."""
        super().__init__()
        if (tier.key is None or tier.value is None) and tier.press is None:
            raise ValueError(f"tier '{tier.name}' does not encode both keys and values; native layers use "
                             "transformers' DynamicLayer")
        check_window(window)
        self.window = window
        self.is_sliding = window is not None  # transformers builds a sliding mask for the layers that say so
        self.tier = dataclasses.replace(tier, keep_first=0) if window and tier.keep_first else tier  # no sinks
        self.coded = tier.key is not None  # False: a press alone, whose kept tokens stay raw (never archived)
        # Tokens archived at a time: whole codec blocks, and at least MIN_ARCHIVE_TOKENS so that per-token
        # codecs (int8) encode once per 8 steps instead of paying an encode/decode call on every step.
        blocks = (tier.key.block_tokens, tier.value.block_tokens) if self.coded else ()
        self.unit = math.lcm(*blocks, MIN_ARCHIVE_TOKENS)
        self.ask_raw_until(raw_until)
        self._reset_state()

    def ask_raw_until(self, raw_until: int | None) -> None:
        """Hold tokens raw until `raw_until` (None: the tier's own N, settled by lazy_initialization); a press alone
        archives nothing, whatever is asked."""
        if raw_until is not None and (isinstance(raw_until, bool) or not isinstance(raw_until, int) or raw_until < 0):
            raise ValueError(f"raw_until={raw_until!r} must be a token count >= 0 (0: archive from the first "
                             "complete unit) or None (the tier's own)")
        raw_until = raw_until if self.coded else None
        self.raw_until_asked = raw_until
        self.raw_until: int | None = raw_until  # tokens held raw before archiving; None once settled: never

    def own_raw_until(self, key_states: torch.Tensor, value_states: torch.Tensor) -> int | None:
        """The tier's own N for states like these (module docstring, "Raw until N"); None: never archive."""
        if not self.coded or not self._archive_smaller(key_states, value_states):
            return None
        first_unit = self.tier.keep_first + self.tier.keep_recent + self.unit
        return view_raw_until(self.tier, self.unit) if self._reads_view(key_states) else first_unit

    def _reads_view(self, key_states: torch.Tensor) -> bool:
        """True when attention would read this layer's tokens from a decoded view (always, for a CodecLayer)."""
        return True

    def _archive_smaller(self, key_states: torch.Tensor, value_states: torch.Tensor) -> bool:
        """True when one archive unit stores fewer bytes than its raw tokens in the states' dtype."""
        dims = (key_states.shape[3], value_states.shape[3])
        raw = self.unit * sum(dims) * key_states.element_size()
        return unit_code_bytes(self.tier.key, self.tier.value, self.unit, dims, key_states.dtype) < raw

    @property
    def holds_raw(self) -> bool:
        """True while nothing is archived: the layer holds its tokens as a native layer would."""
        return self.archived_upto == self.archive_start

    @property
    def archive_start(self) -> int:
        """The position of the first archived token: after the sinks, or the first token a window still holds."""
        return max(self.tier.keep_first, self.first)

    @property
    def held(self) -> int:
        """Tokens held now: every token seen, less those a sliding window dropped."""
        return self.length - self.first

    def _reset_state(self) -> None:
        self.length = 0  # tokens seen, less those a press evicted: where the next one is stored
        self.first = 0  # position of the first token held (a sliding window dropped the ones before it)
        self._reset_press()
        self.archived_upto = self.tier.keep_first  # tokens [archive_start, archived_upto) are archived
        self.archive_k, self.archive_v = Archive(), Archive()
        self._view_k: torch.Tensor | None = None  # (B, H, capacity, D): sinks, decoded archive, raw tail
        self._view_v: torch.Tensor | None = None
        self._rest: RawTokens | None = None  # at rest (compact): the raw tokens, and no view

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        self.value_dim = value_states.shape[3]  # values may be narrower than keys (MLA's latent and its RoPE part)
        self.is_initialized = True
        if self.tier.joint is None:  # groups that do not divide these heads' channels shrink (codecs/fit.py)
            self.tier = self.tier.for_head_dims(key_states.shape[3], value_states.shape[3])
        if self.raw_until_asked is None:
            self.raw_until = self.own_raw_until(key_states, value_states)

    @torch.inference_mode()
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Archive what became archivable, append the new (B, H, T, D) states raw, return the (B, H, S, D) views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.restore()
        self.flush()
        new, held = key_states.shape[2], self.held
        self._ensure_capacity(key_states, held + new)
        self._view_k[:, :, held : held + new] = key_states
        self._view_v[:, :, held : held + new] = value_states
        visible = self._visible_from()
        self.length += new
        self.keys, self.values = self._view_k[:, :, : self.held], self._view_v[:, :, : self.held]
        return self._pressed_after(new, self.keys[:, :, visible:], self.values[:, :, visible:])

    def _chunk(self, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The last `chunk` tokens held, less any sinks among them: (B, H, t, D) keys and values (views)."""
        start = max(self.held - chunk, min(self.length, self.tier.keep_first) - self.first)
        return self._view_k[:, :, start : self.held], self._view_v[:, :, start : self.held]

    def _keep(self, tokens: int, keep: torch.Tensor) -> None:
        """Keep, of the last `tokens` held, those at `keep` (B, H, k): the view becomes exactly what is held."""
        held = self.held
        kept = [gather_tokens(view[:, :, held - tokens : held], keep) for view in (self._view_k, self._view_v)]
        start = held - tokens
        self._view_k = torch.cat([self._view_k[:, :, :start], kept[0]], dim=2)  # exact: its evicted bytes freed
        self._view_v = torch.cat([self._view_v[:, :, :start], kept[1]], dim=2)

    def _visible_from(self) -> int:
        """Index of the first held token the next query sees: the tokens a DynamicSlidingWindowLayer would hand
        attention begin there (get_mask_sizes); 0 for full attention."""
        return 0 if self.window is None else max(self.length - self.window + 1, 0) - self.first

    @torch.inference_mode()
    def _slide(self) -> None:
        """Drop what a sliding window moved past: whole archived units, and raw tokens once nothing before them is
        held (module docstring); no query reads them again."""
        if self.window is None:
            return
        needed = self.length - self.window + 1  # the first position the next query sees
        cut = needed if needed >= self.archived_upto else self.first + (needed - self.first) // self.unit * self.unit
        if cut <= self.first:
            return
        self._drop_front(cut - self.first, min(cut, self.archived_upto) - self.first)
        self.first = cut
        self.archived_upto = max(self.archived_upto, cut)
        self._held_changed()

    def _drop_front(self, tokens: int, archived: int) -> None:
        """Forget the first `tokens` held tokens, `archived` of them archived: the rest moves to the front."""
        self.archive_k.drop_front(archived)
        self.archive_v.drop_front(archived)
        if self._view_k is not None:
            held = self.held
            self._view_k[:, :, : held - tokens] = self._view_k[:, :, tokens:held].clone()
            self._view_v[:, :, : held - tokens] = self._view_v[:, :, tokens:held].clone()

    def _held_changed(self) -> None:
        """keys / values are every held token again (the view's first `held`), after the front moved."""
        if self._view_k is not None:
            self.keys, self.values = self._view_k[:, :, : self.held], self._view_v[:, :, : self.held]

    @torch.inference_mode()
    def flush(self) -> None:
        """Encode every complete block that is neither a sink nor in the recent window, then decode it into the view;
        a window drops what it moved past (call it between forwards: a view handed to attention moves)."""
        flush_layers([self])
        self._slide()

    @torch.inference_mode()
    def adopt(self, key_states: torch.Tensor, value_states: torch.Tensor, first: int = 0) -> None:
        """Take (B, H, S, D) states as this empty layer's tokens from position `first` (a window's: the tokens before
        it dropped), without archiving them yet (flush does)."""
        if self.length:
            raise ValueError("adopt(): the layer already holds tokens")
        if first:
            self.first = self.length = self.archived_upto = first
        self.update(key_states, value_states)

    def set_left_padding(self, pads: torch.Tensor) -> None:
        """Keep every row's sinks raw in a left-padded batch ((B,) pad tokens per row), before any token is held.

        The sinks become the first keep_first + max(pads) positions: every pad token stays raw (a codec
        that shares scales across tokens never fits them to pad states) and so does every row's first
        keep_first real tokens. The most padded row is then archived exactly as its text alone would be.
        """
        if self.length:
            raise ValueError("set_left_padding(): the layer already holds tokens")
        self.padded = int(pads.max()) > 0
        self.tier = dataclasses.replace(self.tier, keep_first=self.tier.keep_first + int(pads.max()))
        self._reset_state()

    needs_decoded = True  # flush_layers hands _archived the decoded tokens (they replace the raw ones in the view)

    def _span(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next `count` tokens to archive, (B, H, count, D) keys and values (views)."""
        start = self.archived_upto - self.first
        return self._view_k[:, :, start : start + count], self._view_v[:, :, start : start + count]

    def _archived(self, count: int, keys: Encoded, values: Encoded, decoded: tuple | None) -> None:
        """Store the archive of the next `count` tokens; their decoded (keys, values) replace them in the view."""
        self.archive_k.append(keys)
        self.archive_v.append(values)
        start = self.archived_upto - self.first
        self._view_k[:, :, start : start + count], self._view_v[:, :, start : start + count] = decoded
        self.archived_upto += count

    def _archivable(self) -> int:
        """Tokens to archive now: whole units after the archive that are neither sinks nor in the recent window;
        none while the layer holds raw and fewer than raw_until tokens (module docstring, "Raw until N")."""
        if self.holds_raw and (self.raw_until is None or self.held < self.raw_until):
            return 0
        end = self.length - self.tier.keep_recent
        return max((end - self.archived_upto) // self.unit * self.unit, 0)

    def _shorten(self, tokens_to_remove: int) -> bool:
        """Validate a crop (5.24: a negative count) and shorten `length`; False when there is nothing to do."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop({tokens_to_remove}): pass a negative number of tokens to remove")
        if tokens_to_remove == 0 or not self.is_initialized:
            return False
        if self.length + tokens_to_remove < self.first:
            raise ValueError(f"crop({tokens_to_remove}): this sliding-window layer dropped the tokens before position "
                             f"{self.first} already (allowed: at most {self.held} tokens)")
        self.length = max(self.length + tokens_to_remove, 0)
        return True

    def _archived_after_crop(self) -> int:
        """Archived tokens that stay after a crop: the whole units before the new end."""
        return max(self.length - self.archive_start, 0) // self.unit * self.unit

    def _ensure_capacity(self, like: torch.Tensor, needed: int) -> None:
        """Room in the view for `needed` tokens: exactly that while the layer holds raw (as a native layer),
        a quarter more than it had once it archives (module docstring)."""
        capacity = 0 if self._view_k is None else self._view_k.shape[2]
        if needed <= capacity:
            return
        capacity = needed if self.holds_raw else grown_capacity(capacity, needed)
        held = self.held
        b, h, _, d = like.shape
        grown_k = like.new_empty((b, h, capacity, d))
        grown_v = like.new_empty((b, h, capacity, self.value_dim))
        if self._view_k is not None:
            grown_k[:, :, :held] = self._view_k[:, :, :held]
            grown_v[:, :, :held] = self._view_v[:, :, :held]
        self._view_k, self._view_v = grown_k, grown_v

    def get_seq_length(self) -> int:
        """Tokens seen: the position of the next one (a press's evicted tokens count)."""
        return self.length + self.evicted

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv length, kv offset) of the next forward's mask: a DynamicSlidingWindowLayer's for a window; past a
        press's eviction, the held tokens come before the queries' positions (causal for the new ones)."""
        if self.window is None:
            return self.held + query_length, self.evicted
        offset = max(self.length - self.window + 1, 0)
        return self.length - offset + query_length, offset

    def get_max_length(self) -> int:
        return -1 if self.window is None else self.window

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
        self.restore()
        if not self._shorten(tokens_to_remove):
            return
        kept = self._archived_after_crop()
        if self.archive_start + kept < self.archived_upto:
            self.archived_upto = self.archive_start + kept
            self.archive_k.truncate(kept)
            self.archive_v.truncate(kept)
        self.keys, self.values = self._view_k[:, :, : self.held], self._view_v[:, :, : self.held]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    @torch.inference_mode()
    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.restore()
        if self._view_k is None:
            return
        indices = indices.to(self._view_k.device)
        self._view_k, self._view_v = self._view_k.index_select(0, indices), self._view_v.index_select(0, indices)
        self.archive_k.select_batch(indices)
        self.archive_v.select_batch(indices)
        self.keys, self.values = self._view_k[:, :, : self.held], self._view_v[:, :, : self.held]

    @torch.inference_mode()
    def batch_repeat_interleave(self, repeats: int) -> None:
        self.restore()
        if self._view_k is None:
            return
        self._view_k = self._view_k.repeat_interleave(repeats, dim=0)
        self._view_v = self._view_v.repeat_interleave(repeats, dim=0)
        self.archive_k.repeat_batch(repeats)
        self.archive_v.repeat_batch(repeats)
        self.keys, self.values = self._view_k[:, :, : self.held], self._view_v[:, :, : self.held]

    def footprint(self, layer: int) -> LayerFootprint:
        """Bytes for the tokens held, after archiving whatever is archivable (design.md definitions)."""
        if self._rest is not None:  # at rest: the archive and the raw tokens, nothing else
            rest = self._rest
            return self._footprint(layer, rest.values_per_token, rest.sink_keys.element_size(), rest.nbytes)
        if self._view_k is None:
            return LayerFootprint(layer, self._kind, True, 0, 0, 0, 0)
        self.flush()
        view = (self._view_k.numel() + self._view_v.numel()) * self._view_k.element_size()
        b, h, _, d = self._view_k.shape
        return self._footprint(layer, b * h * (d + self._view_v.shape[3]), self._view_k.element_size(), view)

    def held_bytes(self) -> int:
        """Bytes of every tensor this layer owns now: archive buffers, the decoded view or, at rest, the raw tokens."""
        held = self._stored()[2]
        if self._rest is not None:
            held += self._rest.nbytes
        if self._view_k is not None:
            held += (self._view_k.numel() + self._view_v.numel()) * self._view_k.element_size()
        return held + self._press_bytes()

    @property
    def _kind(self) -> str:
        """LayerFootprint.kind: "codec", or "codec, sliding W" for a window."""
        return "codec" if self.window is None else f"codec, sliding {self.window}"

    def _stored(self) -> tuple[int, int, int]:
        """(tokens archived, bytes stored for them, bytes allocated for them)."""
        allocated = self.archive_k.allocated_bytes + self.archive_v.allocated_bytes
        return self.archive_k.tokens, self.archive_k.nbytes + self.archive_v.nbytes, allocated

    def _footprint(self, layer: int, values_per_token: int, element_size: int, view_bytes: int) -> LayerFootprint:
        """The layer's LayerFootprint: raw tokens at `element_size`, archive as stored, plus `view_bytes`."""
        archived, codes, allocated = self._stored()
        sinks = min(self.length, self.tier.keep_first)
        after_archive = max(self.length - self.archived_upto, 0)
        window = min(self.tier.keep_recent, after_archive)
        raw_bytes = (self.held - archived) * values_per_token * element_size
        resident = allocated + view_bytes
        seen = self.length + self.evicted
        native = seen if self.window is None else min(seen, self.window - 1)  # what native holds
        return LayerFootprint(
            layer, self._kind, True, self.held,
            archive_bytes=codes + raw_bytes,
            resident_bytes=resident,
            bf16_bytes=native * values_per_token * 2,
            archived_tokens=archived,
            code_bytes=codes,
            reference_tokens=native,
            evicted_tokens=self.evicted,
            sink_tokens=sinks,
            window_tokens=window,
            tail_tokens=after_archive - window,
        )
