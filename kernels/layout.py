"""Reading the row layout each codec declares (codeckv/codecs/layout.py); no codec class is imported here.

    layout = layout_of(codec)             # RowLayout, or NoRowLayout(reason): the torch path
    rows(layout, enc, 0, 64)              # dequantized rows in the stored domain (B, H, n_rows, D) float32
    basis(layout, device)                 # M (k, r); rotation(layout, D, device) -> Q or None

Every codec the kernels handle stores its tokens as rows:

    x[block * r + n] = (sum_j M[j, n] * row[block * k + j]) @ Q.T       token n of a block of r tokens

with M the DCT synthesis basis (the 1x1 identity without a DCT), Q the codec's rotation (the identity
without one) and a row a leaf quantizer's level[code] * scale (+ offset) or a raw float row. Small
float32 tables are built once per device: a decode step must not copy them host -> device.
"""

from __future__ import annotations

import functools

import torch

from codeckv.codecs.layout import (
    Codec,
    Encoded,
    NoRowLayout,
    QuantRows,
    RawRows,
    RowLayout,
    dct_basis,
    slice_encoded,
)


def layout_of(codec: Codec) -> RowLayout | NoRowLayout:
    """The codec's declared layout (a codec that declares none gets a NoRowLayout saying so)."""
    declare = getattr(codec, "row_layout", None)
    if declare is None:
        return NoRowLayout(f"{type(codec).__name__} declares no row layout")
    layout = declare()
    if not isinstance(layout, RowLayout | NoRowLayout):
        raise TypeError(f"{type(codec).__name__}.row_layout() returned {layout!r} (allowed: RowLayout, NoRowLayout)")
    return layout


@functools.cache
def synthesis_basis(block: int, k: int, device: torch.device) -> torch.Tensor:
    """M (k, block) float32 on `device`, built once."""
    return dct_basis(block, k, device)


def basis(layout: RowLayout, device: torch.device | str) -> torch.Tensor:
    """M (k, r) float32 of the layout."""
    return synthesis_basis(layout.block, layout.k, torch.device(device))


@functools.cache
def _rotation(rotating, head_dim: int, device: torch.device) -> torch.Tensor:
    return rotating.matrix(head_dim, device)


def rotation(layout: RowLayout, head_dim: int, device: torch.device | str) -> torch.Tensor | None:
    """Q (D, D) float32, or None without rotation."""
    if layout.rotation is None:
        return None
    return _rotation(layout.rotation, head_dim, torch.device(device))


@functools.cache
def _table(values: tuple[float, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device)


def levels(spec: QuantRows, device: torch.device | str) -> torch.Tensor:
    """level[code]: (2**bits,) float32 (the codebook, or the integer codes)."""
    values = spec.levels if spec.levels is not None else tuple(float(c) for c in range(1 << spec.bits))
    return _table(values, torch.device(device))


def thresholds(spec: QuantRows, device: torch.device | str) -> torch.Tensor:
    """Decision thresholds between levels (2**bits - 1,) float32 (Lloyd-Max encoders only)."""
    return _table(spec.thresholds, torch.device(device))


def scale_multiples(spec: QuantRows, device: torch.device | str) -> torch.Tensor:
    """The encoder's candidate multiples of the group RMS, float32."""
    return _table(spec.scale_multiples, torch.device(device))


def search_errors(spec: QuantRows, device: torch.device | str) -> torch.Tensor:
    """The Lloyd-Max encoder's search table ERRORS (search_bins * multiples,) float32 (codecs/lloyd_search.py)."""
    return _table(spec.search_errors, torch.device(device))


def raw_dtype(layout: RowLayout, x_dtype: torch.dtype) -> torch.dtype:
    """The dtype raw rows are stored in (the layout's, else the tokens')."""
    return layout.rows.dtype or x_dtype


def rows(layout: RowLayout, enc: Encoded, start: int, stop: int) -> torch.Tensor:
    """Dequantized rows of tokens [start, stop) (block-aligned): (B, H, (stop-start)*k/r, D) float32.

    The rows are in the stored domain (DCT coefficients, rotated coordinates), decoded by the leaf
    codec itself on a slice of the archive, so the format has a single source of truth.
    """
    part = slice_encoded(enc, start, stop)
    b, h, s, d = part.shape
    if isinstance(layout.rows, RawRows):
        return part.data[layout.name(layout.rows.name)].float()
    inner = {name[len(layout.prefix) :]: t for name, t in part.data.items()}
    return layout.leaf.decode(Encoded(inner, (b, h, s // layout.block * layout.k, d), torch.float32)).float()


def tensors(layout: RowLayout, enc: Encoded) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(rows or codes, scale, offset) as the kernels read them; scale and offset are None for raw rows."""
    if isinstance(layout.rows, RawRows):
        return enc.data[layout.name(layout.rows.name)], None, None
    spec = layout.rows
    offset = enc.data[layout.name(spec.offset)] if spec.offset else None
    return enc.data[layout.name(spec.codes)], enc.data[layout.name(spec.scale)], offset
