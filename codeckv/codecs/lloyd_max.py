"""Lloyd-Max quantization: MSE-optimal levels for a unit Gaussian, scaled per group.

After a random Hadamard rotation (see rotation.py) the coordinates of a KV vector
are close to Gaussian, so the levels that minimise the mean squared error of a
N(0, 1) variable (Lloyd-Max) beat a uniform min/max grid at the same bits, and a
group needs one fp16 scale instead of a scale and a zero.

The codebook is computed here, once per bit width, by Lloyd iteration on the
exact Gaussian density: thresholds are the midpoints of neighbouring levels, each
level is the mean of N(0, 1) between its thresholds,
E[X | a < X < b] = (pdf(a) - pdf(b)) / (cdf(b) - cdf(a)).

A group of 32 samples rarely reaches the outer Gaussian levels, so encode picks,
per group, the multiple in `scales` of the group RMS with the least predicted
squared error (a table lookup per value, lloyd_search.py), then (refit=True) refits
the scale by least squares on the levels it chose; `scales=(1.0,), refit=False` is
the plain RMS. Decode does not depend on how the scale was chosen.

Groups are as in quant.py: per token (`group` channels of one token) or per channel
(`group` consecutive tokens of one channel, block_tokens = group). No zero point is
stored: after the rotation a group's mean is close to 0.

Storage (`Encoded.data`):

    codes  (B, H, S, D*bits/8)  uint8    codebook indices, packed LSB-first (see bitpack)
    scale  (B, H, S, D/group)   float16  per token | (B, H, S/group, D) per channel

Decode: x = codebook(bits)[code] * scale; codebook(bits) is ascending,
float32, shape (2**bits,), symmetric around 0.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from codeckv.codecs.base import Encoded, check_input
from codeckv.codecs.bitpack import check_bits, pack_bits, unpack_uint8
from codeckv.codecs.layout import QuantRows, RowLayout
from codeckv.codecs.lloyd_search import (
    BIN_SHIFT,
    TINY,
    best_multiple,
    error_table,
    group_rms,
    nearest_codes,
    nearest_levels,
    refit,
)
from codeckv.codecs.quant import check_group, check_row

SCALE_SEARCH = tuple(round(0.5 + 0.05 * i, 2) for i in range(21))  # 0.5, 0.55, ..., 1.5
_TOLERANCE = 1e-6  # stop when no level moves by more than this (in units of sigma)
_MAX_ITERATIONS = 100_000


@functools.cache
def _codebook64(bits: int) -> torch.Tensor:
    """Lloyd-Max levels for N(0, 1) with 2**bits cells, float64 on CPU."""
    n = 1 << bits
    # Start at the quantiles of N(0, 3): the asymptotically optimal level density is pdf**(1/3).
    p = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    levels = math.sqrt(6.0) * torch.erfinv(2 * p - 1)
    inf = torch.tensor([math.inf], dtype=torch.float64)
    for _ in range(_MAX_ITERATIONS):
        edges = torch.cat([-inf, (levels[1:] + levels[:-1]) / 2, inf])  # (n + 1,)
        pdf = torch.exp(-(edges**2) / 2) / math.sqrt(2 * math.pi)
        cdf = torch.special.ndtr(edges)
        new = (pdf[:-1] - pdf[1:]) / (cdf[1:] - cdf[:-1])
        moved = (new - levels).abs().max().item()
        levels = new
        if moved < _TOLERANCE:
            return levels
    raise RuntimeError(f"Lloyd iteration for {bits} bits did not converge")


def codebook(bits: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Ascending Lloyd-Max levels for N(0, 1): (2**bits,) float32 on `device`."""
    check_bits(bits, "codebook")
    return _codebook64(bits).to(device=device, dtype=torch.float32)


def thresholds(bits: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Decision thresholds between neighbouring levels: (2**bits - 1,) float32."""
    levels = codebook(bits, device)
    return (levels[1:] + levels[:-1]) / 2


@dataclass(frozen=True)
class LloydMaxQuant:
    """Gaussian Lloyd-Max levels times a per-group fp16 scale (a searched multiple of the RMS, refitted)."""

    bits: int = 4
    group: int = 32
    per_channel: bool = False
    scales: tuple[float, ...] = SCALE_SEARCH
    refit: bool = True  # least-squares refit of the chosen scale on the chosen levels

    def __post_init__(self) -> None:
        check_bits(self.bits, "LloydMaxQuant")
        check_group(self.group, "LloydMaxQuant")
        if not self.scales or not all(isinstance(m, (int, float)) and m > 0 for m in self.scales):
            raise ValueError(
                f"LloydMaxQuant: scales={self.scales!r} must be a non-empty tuple of positive "
                "multiples of the group RMS (e.g. (1.0,) or the default 0.5..1.5 grid)"
            )
        if not isinstance(self.refit, bool):
            raise ValueError(f"LloydMaxQuant: refit={self.refit!r} must be True or False")

    @property
    def block_tokens(self) -> int:
        """Per-channel groups span `group` tokens; per-token groups need no block."""
        return self.group if self.per_channel else 1

    def levels(self) -> tuple[float, ...]:
        """The float32 codebook as a tuple (the lookup tables of lloyd_search.py are cached on it)."""
        return _levels(self.bits)

    def encode(self, x: torch.Tensor) -> Encoded:
        """Per group: the searched fp16 scale (lloyd_search.py) and the nearest codebook index of every value."""
        check_input(x, self.block_tokens, "LloydMaxQuant")
        check_row(tuple(x.shape), self.bits, self.group, self.per_channel, "LloydMaxQuant")
        y = _rows(x.float(), self.group, self.per_channel)  # (N groups, group)
        levels = self.levels()
        rms = group_rms(y)
        multiples = torch.tensor(self.scales, dtype=torch.float32, device=x.device)
        scale = (rms * multiples[best_multiple(y, rms, levels, self.scales)]).half()  # (N, 1)
        if self.refit:
            scale = refit(y, nearest_levels(y / scale.float().clamp_min(TINY), levels))
        codes = nearest_codes(y / scale.float().clamp_min(TINY), levels)
        b, h, s, d = x.shape
        stat_shape = (b, h, s // self.group, d) if self.per_channel else (b, h, s, d // self.group)
        data = {
            "codes": pack_bits(_tokens(codes, x.shape, self.group, self.per_channel), self.bits),  # (B, H, S, D*b/8)
            "scale": scale.view(stat_shape),  # (B, H, S, D/g) or (B, H, S/g, D)
        }
        return Encoded(data, tuple(x.shape), x.dtype)

    def decode(self, enc: Encoded) -> torch.Tensor:
        """x = codebook[code] * scale, as (B, H, S, D) in the original dtype."""
        b, h, s, d = enc.shape
        codes = unpack_uint8(enc.data["codes"], self.bits)  # (B, H, S, D)
        table = codebook(self.bits, codes.device)
        levels = table.index_select(0, codes.reshape(-1).int()).view(b, h, s, d)
        scale = enc.data["scale"].float()
        if self.per_channel:
            out = levels.view(b, h, s // self.group, self.group, d) * scale.unsqueeze(3)
        else:
            out = levels.view(b, h, s, d // self.group, self.group) * scale.unsqueeze(4)
        return out.view(enc.shape).to(enc.dtype)

    def nbytes(self, enc: Encoded) -> int:
        """Codes and scales."""
        return enc.nbytes

    def row_layout(self) -> RowLayout:
        """Rows of codebook indices: x = codebook[code] * scale, no offset; the encoder's search tables."""
        return RowLayout(_quant_rows(self.bits, self.group, self.per_channel, self.scales, self.refit), leaf=self)


@functools.cache
def _quant_rows(bits: int, group: int, per_channel: bool, scales: tuple[float, ...], refit: bool) -> QuantRows:
    """The QuantRows of a LloydMaxQuant, built once (its search table is a few thousand floats)."""
    multiples = tuple(float(m) for m in scales)
    table, bins = error_table(_levels(bits), multiples, group)
    return QuantRows(
        bits, group, per_channel,
        levels=_levels(bits),
        thresholds=tuple(thresholds(bits).tolist()),
        scale_multiples=multiples,
        search_errors=tuple(table.reshape(-1).tolist()),
        search_bins=bins,
        search_shift=BIN_SHIFT,
        refit=refit,
    )


@functools.cache
def _levels(bits: int) -> tuple[float, ...]:
    return tuple(codebook(bits).tolist())


def _rows(x: torch.Tensor, group: int, per_channel: bool) -> torch.Tensor:
    """The quantization groups of x (B, H, S, D) as rows (N, group): a view per token, a copy per channel."""
    b, h, s, d = x.shape
    if per_channel:  # group = `group` consecutive tokens of one channel
        return x.view(b, h, s // group, group, d).transpose(3, 4).contiguous().view(-1, group)
    return x.reshape(-1, group)


def _tokens(rows: torch.Tensor, shape: torch.Size, group: int, per_channel: bool) -> torch.Tensor:
    """Inverse of _rows: (N, group) back to (B, H, S, D)."""
    b, h, s, d = shape
    if per_channel:
        return rows.view(b, h, s // group, d, group).transpose(3, 4).reshape(b, h, s, d)
    return rows.view(b, h, s, d)
