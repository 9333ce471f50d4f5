"""Row layouts: how a codec's stored tensors read as rows, declared by the codec for the kernels.

Every codec answers `codec.row_layout()` with a `RowLayout` or, when no kernel can read what it
stores, a `NoRowLayout` whose `reason` the app shows. A RowLayout says (design.md, kernels/):

    x[block * r + n] = (sum_j M[j, n] * row[block * k + j]) @ Q.T       token n of a block of r tokens

    r, k       `block` tokens per block and `k` stored rows per block (DCT); 1 and 1 otherwise
    M (k, r)   the DCT-II synthesis basis (codecs/dct.py) when block > 1
    Q (D, D)   `rotation.matrix(D, device)` (codecs/rotation.py), or the identity when rotation is None
    row        `rows`: a quantizer's dequantized row, level[code] * scale (+ offset), or a raw row

so attention can run on the rows (q . x = (q Q) . row weighted by M) without ever decoding x.
Composite codecs build their layout from their inner codec's: DCT sets r, k and prefixes the inner
tensor names with "coeffs."; Rotation sets Q. This module is the only part of `codeckv.codecs`
that the kernels import: it re-exports the `Encoded` helpers they need.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Protocol

import torch

from codeckv.codecs.base import Codec, Encoded, check_input, slice_encoded
from codeckv.codecs.bitpack import pack_unit

__all__ = [
    "Codec", "Encoded", "NoRowLayout", "QuantRows", "RawRows", "RowLayout", "check_input", "dct_basis", "slice_encoded",
]


def dct_basis(block_size: int, k: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The k lowest rows of the orthonormal DCT-II basis: M (k, block_size) float32 ([[1.]] for 1, 1)."""
    j = torch.arange(k, dtype=torch.float64)[:, None]
    n = torch.arange(block_size, dtype=torch.float64)[None, :]
    basis = torch.cos(math.pi / block_size * (n + 0.5) * j) * math.sqrt(2.0 / block_size)
    basis[0] = math.sqrt(1.0 / block_size)
    return basis.to(device=device, dtype=torch.float32)


class Rotating(Protocol):
    """What a layout's rotation offers: the orthonormal Q the rows were rotated by (x @ Q)."""

    def matrix(self, head_dim: int, device: torch.device | str = "cpu") -> torch.Tensor: ...


@dataclass(frozen=True)
class QuantRows:
    """Rows stored as b-bit codes, packed LSB-first along head_dim: row = level[code] * scale (+ offset)."""

    bits: int
    group: int
    per_channel: bool  # one scale per `group` rows of a channel, else per `group` channels of a row
    levels: tuple[float, ...] | None = None  # level[code]: a codebook (Lloyd-Max), or None for the integer code
    thresholds: tuple[float, ...] | None = None  # decision thresholds between the levels (encoders only)
    scale_multiples: tuple[float, ...] = ()  # encoder: candidate multiples of the group RMS; () = min/max grid
    search_errors: tuple[float, ...] = ()  # encoder: ERRORS (search_bins, len(scale_multiples)) flattened
    search_bins: int = 0  # encoder: bins of |y| / rms, each 2**-search_shift wide (codecs/lloyd_search.py)
    search_shift: int = 0
    refit: bool = False  # encoder: least-squares refit of the chosen scale
    codes: str = "codes"  # names of the stored tensors (before the layout's prefix)
    scale: str = "scale"
    offset: str | None = None  # e.g. "zero" (added after scaling), or None
    codec_encodes: bool = False  # the codec's own encoder chooses the codes (vLLM's rounding); kernels only read

    @property
    def lloyd_max(self) -> bool:
        return self.levels is not None

    def packs(self, head_dim: int) -> bool:
        """True when every packing unit of codes lies inside one quantization group (what tiled encoders need)."""
        width = head_dim if self.per_channel else self.group
        return width % pack_unit(self.bits)[0] == 0

    def fits(self, head_dim: int) -> bool:
        """True when rows of head_dim channels pack into whole bytes and (per token) split into groups."""
        return head_dim % pack_unit(self.bits)[0] == 0 and (self.per_channel or head_dim % self.group == 0)


@dataclass(frozen=True)
class RawRows:
    """Rows stored as floats under `name`, in `dtype` (None: the tokens' own dtype)."""

    name: str
    dtype: torch.dtype | None = None


@dataclass(frozen=True)
class RowLayout:
    """A codec read as rows (module docstring)."""

    rows: QuantRows | RawRows
    leaf: Codec | None = None  # the codec that decodes quantized rows (the format's single source of truth)
    block: int = 1  # r: tokens per block
    k: int = 1  # stored rows per block
    rotation: Rotating | None = None  # Q, or None for the identity
    prefix: str = ""  # prefix of every stored tensor name (a DCT's inner codec stores under "coeffs.")

    @property
    def quant(self) -> QuantRows | None:
        return self.rows if isinstance(self.rows, QuantRows) else None

    def name(self, tensor: str) -> str:
        """The key of one of the row tensors in Encoded.data."""
        return self.prefix + tensor

    def within(self, block: int, k: int, prefix: str) -> RowLayout | NoRowLayout:
        """This layout as the rows of a DCT (block r, k rows per block) storing it under `prefix`."""
        if self.block != 1:
            return NoRowLayout("a DCT inside a DCT: no kernel reads nested block transforms")
        return dataclasses.replace(self, block=block, k=k, prefix=prefix + self.prefix)

    def rotated(self, rotation: Rotating) -> RowLayout | NoRowLayout:
        """This layout with its rows rotated by `rotation` first."""
        if self.rotation is not None:
            return NoRowLayout("two rotations in a row: no kernel composes them")
        return dataclasses.replace(self, rotation=rotation)


@dataclass(frozen=True)
class NoRowLayout:
    """A codec no kernel reads; the ops use its own encode / decode (the torch path) and say why."""

    reason: str
