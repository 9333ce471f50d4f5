"""An append-only, capacity-doubling store of one codec's archived chunks.

Every tensor a codec stores is (B, H, N, ...) with N proportional to the tokens it
encodes (codecs/base.py), so appending a chunk is one slice write per tensor into a
preallocated buffer that grows by a fraction of its rows when full (no minimum: a short
archive holds little slack) — never a concatenation of the history.
Bytes written stay untouched until `truncate` (crop), `drop_front` (a sliding window moved past them) or a batch
reorder.
"""

from __future__ import annotations

import torch

from codeckv.codecs.base import Encoded


def grown_capacity(capacity: int, needed: int) -> int:
    """The rows a growing buffer takes to hold `needed`: a quarter more than it had (amortized O(1) per appended
    row), or exactly `needed` when that is more (cache/layers.py grows its decoded view so too)."""
    return max(needed, capacity + capacity // 4)


class Archive:
    """Archived tokens of one codec stream (keys or values) of one layer.

    tight=False: buffers grow by a quarter when full (grown_capacity: amortized O(1) appends, at most 25%
    slack), beside a decoded view.
    tight=True: buffers grow by 1/32 of the rows they need (at most ~3% slack), for the
    materialization-free cache whose resident bytes should stay close to its archive.
    """

    def __init__(self, tight: bool = False) -> None:
        self.tight = tight
        self.tokens = 0  # tokens archived so far
        self._rows: dict[str, int] = {}  # used rows (dim 2) per stored tensor
        self._buffers: dict[str, torch.Tensor] = {}  # (B, H, capacity_rows, ...) per stored tensor
        self._shape: tuple[int, int, int, int] | None = None  # (B, H, tokens, D) template
        self._dtype: torch.dtype | None = None

    @classmethod
    def holding(cls, enc: Encoded, tight: bool = False) -> Archive:
        """An archive whose buffers are enc's own tensors (exact size, no copy): a loaded cache (saved_load.py)."""
        archive = cls(tight)
        archive._buffers = dict(enc.data)
        archive._rows = {name: t.shape[2] for name, t in enc.data.items()}
        archive.tokens, archive._shape, archive._dtype = enc.shape[2], enc.shape, enc.dtype
        return archive

    def append(self, enc: Encoded) -> None:
        """Store the archive of the next enc.shape[2] tokens after the ones already stored."""
        for name, tensor in enc.data.items():
            used = self._rows.get(name, 0)
            buffer = self._buffers.get(name)
            need = used + tensor.shape[2]
            if buffer is None or need > buffer.shape[2]:
                if self.tight:
                    capacity = need + need // 32
                else:
                    capacity = grown_capacity(buffer.shape[2] if buffer is not None else 0, need)
                grown = tensor.new_empty(tensor.shape[:2] + (capacity,) + tensor.shape[3:])
                if buffer is not None:
                    grown[:, :, :used] = buffer[:, :, :used]
                self._buffers[name] = buffer = grown
            buffer[:, :, used:need] = tensor
            self._rows[name] = need
        self.tokens += enc.shape[2]
        self._shape, self._dtype = enc.shape, enc.dtype

    def encoded(self) -> Encoded:
        """Everything archived, as one Encoded (views into the buffers, no copy)."""
        if self._shape is None:
            raise ValueError("the archive is empty")
        b, h, _, d = self._shape
        data = {name: buf[:, :, : self._rows[name]] for name, buf in self._buffers.items()}
        return Encoded(data, (b, h, self.tokens, d), self._dtype)

    def truncate(self, tokens: int) -> None:
        """Keep only the first `tokens` archived tokens (a multiple of the codec's block)."""
        if tokens >= self.tokens:
            return
        for name in self._rows:
            self._rows[name] = self._rows[name] * tokens // self.tokens
        self.tokens = tokens

    def drop_front(self, tokens: int) -> None:
        """Forget the first `tokens` archived tokens (whole blocks, which a sliding window moved past): the rest moves
        to the front of the buffers."""
        if tokens <= 0:
            return
        for name, used in self._rows.items():
            rows, buffer = used * tokens // self.tokens, self._buffers[name]
            buffer[:, :, : used - rows] = buffer[:, :, rows:used].clone()
            self._rows[name] = used - rows
        self.tokens -= tokens

    def trim(self) -> None:
        """Drop the capacity slack: every buffer becomes an exact-size copy of its used rows (a cache at rest)."""
        for name, buf in self._buffers.items():
            if buf.shape[2] != self._rows[name]:
                self._buffers[name] = buf[:, :, : self._rows[name]].clone()

    def select_batch(self, indices: torch.Tensor) -> None:
        """Reorder / select batch rows (beam search): index dim 0 of every buffer."""
        for name, buf in self._buffers.items():
            self._buffers[name] = buf.index_select(0, indices.to(buf.device))
        if self._shape is not None:
            self._shape = (len(indices),) + self._shape[1:]

    def repeat_batch(self, repeats: int) -> None:
        """Repeat every batch row `repeats` times (beam search expansion)."""
        for name, buf in self._buffers.items():
            self._buffers[name] = buf.repeat_interleave(repeats, dim=0)
        if self._shape is not None:
            self._shape = (self._shape[0] * repeats,) + self._shape[1:]

    @property
    def nbytes(self) -> int:
        """Bytes of the archived rows (what the codec stores for these tokens)."""
        return sum(self._row_bytes(name) * rows for name, rows in self._rows.items())

    @property
    def allocated_bytes(self) -> int:
        """Bytes of the buffers including capacity slack."""
        return sum(buf.numel() * buf.element_size() for buf in self._buffers.values())

    def _row_bytes(self, name: str) -> int:
        buf = self._buffers[name]
        return buf.numel() // max(buf.shape[2], 1) * buf.element_size()
