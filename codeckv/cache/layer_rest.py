"""What a codec layer keeps at rest and in a saved file: its archive and its raw tokens, nothing that can be rebuilt.

CodecLayer (codeckv/cache/layers.py) takes this mixin. `compact()` (e.g. an idle chat session) keeps the archive,
exact-size, and the raw tokens (RawTokens: the sinks and the raw tail); `restore()`, or the next update, decodes
the archive into the view again, bit for bit as before. `export_state()` / `load_state()` hand that same content to
and from a file (cache/saved_format.py), `raw_until` included. CodedLayer and PCALayer override the parts that
differ (where their raw tokens live, how their archive is stored).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from codeckv.cache.archive import Archive
from codeckv.cache.kernel_ops import decode
from codeckv.codecs.base import Encoded


@dataclass
class RawTokens:
    """What a layer keeps at full precision besides its archive: sinks and raw tail, exact-size (B, H, n, D)."""

    sink_keys: torch.Tensor
    sink_values: torch.Tensor
    tail_keys: torch.Tensor
    tail_values: torch.Tensor

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        return {"sink_keys": self.sink_keys, "sink_values": self.sink_values,
                "tail_keys": self.tail_keys, "tail_values": self.tail_values}

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    @property
    def values_per_token(self) -> int:
        """Numbers per token, keys and values of every row and head: B x H x (D + Dv)."""
        b, h, _, d = self.sink_keys.shape
        return b * h * (d + self.sink_values.shape[3])


class RestingLayer:
    """Mixin: a layer's rest (compact / restore) and its saved state (export_state / load_state)."""

    def _raw_tokens(self) -> RawTokens:
        """The sinks and the raw tail as exact-size tensors (copies from the view, or those kept at rest)."""
        if self._rest is not None:
            return self._rest
        sinks = min(self.length, self.tier.keep_first)
        tail = slice(min(self.archived_upto, self.length) - self.first, self.held)
        k, v = self._view_k, self._view_v
        return RawTokens(k[:, :, :sinks].clone(), v[:, :, :sinks].clone(), k[:, :, tail].clone(), v[:, :, tail].clone())

    @torch.inference_mode()
    def compact(self) -> None:
        """Go to rest: keep the archive (exact size) and the raw tokens; drop the decoded view (restore rebuilds it)."""
        if self._view_k is None:  # empty, or at rest already
            return
        self.flush()
        self._rest = self._raw_tokens()
        self._trim_archive()
        self._view_k = self._view_v = None
        self.keys, self.values = self.keys.to("meta"), self.values.to("meta")

    @torch.inference_mode()
    def restore(self) -> float:
        """Rebuild the decoded view of a layer at rest, bit for bit as before: seconds taken (0.0 if not at rest)."""
        if self._rest is None:
            return 0.0
        start, rest = time.perf_counter(), self._rest
        b, h, _, d = rest.sink_keys.shape
        view_k = rest.sink_keys.new_empty((b, h, self.held, d))  # exact: the next update grows it if it must
        view_v = rest.sink_values.new_empty((b, h, self.held, rest.sink_values.shape[3]))
        sinks, tail = rest.sink_keys.shape[2], slice(min(self.archived_upto, self.length) - self.first, self.held)
        view_k[:, :, :sinks], view_v[:, :, :sinks] = rest.sink_keys, rest.sink_values
        if self.archived_upto > self.archive_start:
            archived = slice(self.archive_start - self.first, self.archived_upto - self.first)
            view_k[:, :, archived], view_v[:, :, archived] = self._decode_archive(rest.sink_keys)
        view_k[:, :, tail], view_v[:, :, tail] = rest.tail_keys, rest.tail_values
        self._view_k, self._view_v, self._rest = view_k, view_v, None
        self.keys, self.values = view_k[:, :, : self.held], view_v[:, :, : self.held]
        if view_k.is_cuda:
            torch.cuda.synchronize(view_k.device)
        return time.perf_counter() - start

    def _decode_archive(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every archived token decoded, (B, H, archived, D) keys and values in like's dtype."""
        return decode(self.archive_k.encoded(), self.tier.key), decode(self.archive_v.encoded(), self.tier.value)

    def _trim_archive(self) -> None:
        self.archive_k.trim()
        self.archive_v.trim()

    def export_state(self) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
        """What this layer stores: its raw tokens and archive as named exact-size tensors, and the counts that
        place them (cache/saved_format.py writes them). The layer itself is left as it was (flushed)."""
        self.flush()
        tensors = dict(self._raw_tokens().tensors)
        tensors.update(self._archive_tensors())
        counts = {"length": self.length, "archived_upto": self.archived_upto, "raw_until": self.raw_until}
        return tensors, counts | ({"first": self.first} if self.window is not None else {})

    def _archive_tensors(self) -> dict[str, torch.Tensor]:
        if not self.archive_k.tokens:
            return {}
        pairs = (("keys", self.archive_k), ("values", self.archive_v))
        return {f"{side}.{name}": t for side, archive in pairs for name, t in archive.encoded().data.items()}

    @torch.inference_mode()
    def load_state(self, tensors: dict[str, torch.Tensor], counts: dict[str, int]) -> None:
        """Become, while empty, the layer that export_state described, at rest (cache/saved_load.py checked it)."""
        if self.length:
            raise ValueError("load_state(): the layer already holds tokens")
        rest = RawTokens(tensors["sink_keys"], tensors["sink_values"], tensors["tail_keys"], tensors["tail_values"])
        self.lazy_initialization(rest.sink_keys, rest.sink_values)
        self.length, self.archived_upto = counts["length"], counts["archived_upto"]
        self.first = counts.get("first", 0)
        self.raw_until = counts["raw_until"]  # as saved: the file resumes archiving where its cache would have
        b, h, _, d = rest.sink_keys.shape
        meta = {"dtype": rest.sink_keys.dtype, "device": "meta"}
        self.keys = torch.empty((b, h, self.held, d), **meta)
        self.values = torch.empty((b, h, self.held, rest.sink_values.shape[3]), **meta)
        self._load_archive(tensors, rest)
        self._load_raw(rest)

    def _load_archive(self, tensors: dict[str, torch.Tensor], rest: RawTokens) -> None:
        archived = self.archived_upto - self.archive_start
        if archived <= 0:
            return
        for side, like in (("keys", rest.sink_keys), ("values", rest.sink_values)):
            data = {name.split(".", 1)[1]: t for name, t in tensors.items() if name.startswith(f"{side}.")}
            shape = (like.shape[0], like.shape[1], archived, like.shape[3])
            setattr(self, f"archive_{side[0]}", Archive.holding(Encoded(data, shape, like.dtype), self.archive_k.tight))

    def _load_raw(self, rest: RawTokens) -> None:
        self._rest = rest
