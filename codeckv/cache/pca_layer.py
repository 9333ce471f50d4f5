"""PCALayer: the cache layer of a PCA tier, whose calibrated coder codes keys and values together.

It holds tokens like a CodecLayer (codeckv/cache/layers.py) — sinks, archived chunks, raw tail, one memoized
decoded view that attention reads — with two differences:

- its coder belongs to one model layer (a calibrated basis, codecs/pca.py) and removes RoPE from keys,
  so it needs each token's absolute position: its index in the cache. That holds for every path of this
  product (one sequence, or equal-length rows, starting at position 0); left-padded batches are not supported.
- the archive is a list of entropy-coded chunks of `unit` tokens (bytes), not fixed-size code tensors;
  `footprint()` counts exactly those bytes. Flushing encodes, and writes into the view what the stored streams
  decode to, computed from the integer codes (LayerCoder.archive: the same bits, no entropy decoding).
  At rest (`compact()`) the layer keeps the chunks and its raw tokens only; restoring decodes the chunks again.

Like every layer with a decoded view it holds a short context raw (codeckv/cache/layers.py, "Raw until N"); its
archive is smaller than the raw tokens whenever the tier's bits per element are fewer than the dtype's. Holding a
short context raw needs no coder: a layer built with `later` instead of a coder (a Deferred calibration, whose
computation a short chat need not wait for) calls it at its first archive, and holds raw until
tokens_before_coder(tier) tokens, checking then that its archive pays off.

Beam search (batch reordering) and the materialization-free mode are not supported.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers.cache_utils import DynamicLayer

from codeckv.cache.layer_rest import RawTokens
from codeckv.cache.layers import MIN_ARCHIVE_TOKENS, CodecLayer, view_raw_until
from codeckv.codecs.base import Encoded
from codeckv.codecs.pca import Chunk, LayerCoder, archive_layers, spent
from codeckv.tiers import Tier


def tokens_before_coder(tier: Tier) -> int:
    """Tokens a PCA layer asked to hold its tokens raw until its own N (raw_until=None) holds before its first archive,
    whichever its share of the budget: no cache holding fewer needs the tier's calibration."""
    return view_raw_until(tier, MIN_ARCHIVE_TOKENS)  # a PCA layer reads a decoded view; its unit: MIN_ARCHIVE_TOKENS


class PCALayer(CodecLayer):
    """One full-attention layer of a PCA tier (module docstring); flush_layers archives PCA layers together."""

    variable_length = ("streams",)  # entropy-coded bytes: concatenated over layers in a file (cache/saved_format.py)

    def __init__(self, tier: Tier, coder: LayerCoder | None, share: float = 1.0, raw_until: int | None = 0,
                 later: Callable[[], tuple[LayerCoder, float]] | None = None) -> None:
        """share: this layer's share of the tier's bits per element (codeckv.cache.calibration.budget_shares);
        raw_until: as CodecLayer's; later: with coder None, what gives (coder, share) at the first archive."""
        DynamicLayer.__init__(self)
        if tier.joint is None:
            raise ValueError(f"tier '{tier.name}' has no joint coder: use CodecLayer (allowed: a PCA tier)")
        if (coder is None) == (later is None):
            raise ValueError("give a PCA layer its coder, or (coder None) `later` to find it at the first archive")
        if not share > 0:
            raise ValueError(f"share={share!r}: a layer's share of the budget must be positive")
        self.tier, self._coder, self.share, self._later = tier, coder, share, later
        self.window, self.is_sliding = None, False  # full attention only (cache/schedule.py, codes_layer)
        self.unit, self.coded = MIN_ARCHIVE_TOKENS, True  # tokens per stored chunk; it codes what it holds
        self.ask_raw_until(raw_until)
        self._reset_state()

    @property
    def coder(self) -> LayerCoder:
        """This layer's coder (found now if it was left for later)."""
        if self._coder is None:
            self._find_coder()
        return self._coder

    def _find_coder(self) -> None:
        self._coder, self.share = self._later()

    def own_raw_until(self, key_states: torch.Tensor, value_states: torch.Tensor) -> int | None:
        """As CodecLayer's; without its coder yet, tokens_before_coder (whether the archive pays off is checked at
        the first archive, _archivable)."""
        if self._coder is None:
            return tokens_before_coder(self.tier)
        return super().own_raw_until(key_states, value_states)

    def _archivable(self) -> int:
        """As CodecLayer's; the first archive of a layer left without its coder finds it, and holds every token raw
        from then on if its share makes the archive no smaller than the raw tokens."""
        count = super()._archivable()
        if count > 0 and self._coder is None:
            self._find_coder()
            if self.raw_until_asked is None and not self._archive_smaller(self._view_k, self._view_v):
                self.raw_until = None
                return 0
        return count

    def _archive_smaller(self, key_states: torch.Tensor, value_states: torch.Tensor) -> bool:
        """True when this layer's budget (codecs/rate.py: every byte stored, from REPAY_TOKENS tokens on) is fewer
        bits per element than the states' dtype."""
        return self.tier.joint.bits_per_element * self.share < 8 * key_states.element_size()

    def _reset_state(self) -> None:
        self.length = 0  # tokens held
        self.first = 0  # a PCA layer is never a sliding window's: it holds every token from position 0
        self._reset_press()  # nor does a press evict from it (codeckv/tiers.py refuses one)
        self.archived_upto = self.tier.keep_first  # tokens [keep_first, archived_upto) are archived
        self.chunks: list[Chunk] = []  # one per `unit` archived tokens, in order
        self._view_k: torch.Tensor | None = None  # (B, H, capacity, D): sinks, decoded archive, raw tail
        self._view_v: torch.Tensor | None = None
        self._rest: RawTokens | None = None  # at rest (compact): the raw tokens, and no view

    @torch.inference_mode()
    def flush(self) -> None:
        """Encode each complete chunk outside the sinks and the recent window; what they decode to goes in the view."""
        request = self._flush_request()
        if request is not None:
            self._flushed(*archive_layers([request])[0])

    def _flush_request(self) -> tuple | None:
        """What flush hands the coder (codecs/pca.py archive_layers; flush_layers batches layers), or None."""
        count = self._archivable()
        if count <= 0:
            return None
        keys, values = self._span(count)
        budget = self.coder.budget(self.tier.joint.bits_per_element * self.share, keys.shape[0])
        return self.coder, keys, values, self.archived_upto, self.unit, budget, spent(self.chunks, self.unit)

    def _flushed(self, chunks: list[Chunk], decoded: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Keep the chunks archive_layers made of this layer's request; what they decode to goes in the view."""
        start, count = self.archived_upto, decoded[0].shape[2]
        self.chunks += chunks
        self._view_k[:, :, start : start + count], self._view_v[:, :, start : start + count] = decoded
        self.archived_upto += count

    def _stored(self) -> tuple[int, int, int]:
        held = sum(chunk.nbytes for chunk in self.chunks)
        return len(self.chunks) * self.unit, held, held

    def _decode_archive(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.coder.decode(self.chunks, self.tier.keep_first, self.unit, like.shape[0], like.dtype)

    def _trim_archive(self) -> None:
        """Chunks are exact-size byte strings already."""

    def _archive_tensors(self) -> dict[str, torch.Tensor]:
        """The chunks' streams end to end (uint8), their lengths (int32) and rungs (uint8), each sink chunk's sink."""
        if not self.chunks:
            return {}
        streams = bytearray(b"".join(chunk.stream for chunk in self.chunks))
        tensors = {
            "streams": torch.frombuffer(streams, dtype=torch.uint8) if streams else torch.empty(0, dtype=torch.uint8),
            "stream_lengths": torch.tensor([len(chunk.stream) for chunk in self.chunks], dtype=torch.int32),
            "rungs": torch.tensor([chunk.rung for chunk in self.chunks], dtype=torch.uint8),
        }
        for j, chunk in enumerate(self.chunks):
            if chunk.sink:
                for side, enc in zip(("keys", "values"), chunk.sink):
                    tensors.update({f"sink{j}.{side}.{name}": t for name, t in enc.data.items()})
        return tensors

    def _load_archive(self, tensors: dict[str, torch.Tensor], rest: RawTokens) -> None:
        """The chunks back from _archive_tensors (sink chunks: those whose rows start below the coder's sink_tokens)."""
        count = max(self.archived_upto - self.tier.keep_first, 0) // self.unit
        lengths = tensors["stream_lengths"].tolist() if count else []
        rungs = tensors["rungs"].tolist() if count else []
        data = tensors["streams"].numpy().tobytes() if count else b""
        self.chunks, offset = [], 0
        for j, length in enumerate(lengths):
            rows = min(max(self.coder.sink_tokens - self.tier.keep_first - j * self.unit, 0), self.unit)
            sink = None
            if rows:
                sink = tuple(
                    Encoded({n.split(".", 2)[2]: t for n, t in tensors.items() if n.startswith(f"sink{j}.{side}.")},
                            (like.shape[0], like.shape[1], rows, like.shape[3]), like.dtype)
                    for side, like in (("keys", rest.sink_keys), ("values", rest.sink_values))
                )
            self.chunks.append(Chunk(data[offset : offset + length], rungs[j], sink))
            offset += length

    @torch.inference_mode()
    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last -tokens_to_remove tokens; chunks past the new end are dropped (CodecLayer.crop)."""
        self.restore()
        if not self._shorten(tokens_to_remove):
            return
        kept = self._archived_after_crop()
        if self.tier.keep_first + kept < self.archived_upto:
            self.archived_upto = self.tier.keep_first + kept
            del self.chunks[kept // self.unit :]
        self.keys, self.values = self._view_k[:, :, : self.length], self._view_v[:, :, : self.length]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise ValueError(f"tier '{self.tier.name}' does not support beam search or batch reordering "
                         "(allowed: greedy or sampled generation)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise ValueError(f"tier '{self.tier.name}' does not support repeating batch rows "
                         "(allowed: num_return_sequences=1)")

    def set_left_padding(self, pads: torch.Tensor) -> None:
        if int(pads.max()):
            raise ValueError(f"tier '{self.tier.name}' removes RoPE at each token's index in the cache, which a "
                             "left-padded row does not start at (allowed: rows of equal length, no padding)")
