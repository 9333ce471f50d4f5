"""Lloyd-Max quantization: MSE-optimal levels for a unit Gaussian, scaled per group.

After a random Hadamard rotation (see rotation.py) the coordinates of a KV vector
are close to Gaussian, so the levels that minimise the mean squared error of a
N(0, 1) variable (Lloyd-Max) beat a uniform min/max grid at the same bits, and a
group needs one fp16 scale instead of a scale and a zero.

The codebook is computed here, once per bit width, by Lloyd iteration on the
exact Gaussian density: thresholds are the midpoints of neighbouring levels, each
level is the mean of N(0, 1) between its thresholds,
E[X | a < X < b] = (pdf(a) - pdf(b)) / (cdf(b) - cdf(a)).

A group of 32 samples rarely reaches the outer Gaussian levels, so encode tries
each multiple in `scales` of the group RMS and keeps, per group, the fp16 scale
with the lowest squared error; `scales=(1.0,)` is the plain RMS. Decode does not
depend on how the scale was chosen.

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
from codeckv.codecs.bitpack import check_bits, pack_bits, unpack_bits
from codeckv.codecs.layout import QuantRows, RowLayout
from codeckv.codecs.quant import check_group, check_row, grouped

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
    """Gaussian Lloyd-Max levels times a per-group fp16 scale (a searched multiple of the RMS)."""

    bits: int = 4
    group: int = 32
    per_channel: bool = False
    scales: tuple[float, ...] = SCALE_SEARCH

    def __post_init__(self) -> None:
        check_bits(self.bits, "LloydMaxQuant")
        check_group(self.group, "LloydMaxQuant")
        if not self.scales or not all(isinstance(m, (int, float)) and m > 0 for m in self.scales):
            raise ValueError(
                f"LloydMaxQuant: scales={self.scales!r} must be a non-empty tuple of positive "
                "multiples of the group RMS (e.g. (1.0,) or the default 0.5..1.5 grid)"
            )

    @property
    def block_tokens(self) -> int:
        """Per-channel groups span `group` tokens; per-token groups need no block."""
        return self.group if self.per_channel else 1

    def encode(self, x: torch.Tensor) -> Encoded:
        """Per group: nearest codebook index under the best of the candidate fp16 scales."""
        check_input(x, self.block_tokens, "LloydMaxQuant")
        check_row(tuple(x.shape), self.bits, self.group, self.per_channel, "LloydMaxQuant")
        xg, axis = grouped(x.float(), self.group, self.per_channel)
        rms = xg.square().mean(axis, keepdim=True).sqrt()
        codes, scale, error = self._fit(xg, axis, rms * self.scales[0])
        for multiple in self.scales[1:]:
            c, sc, err = self._fit(xg, axis, rms * multiple)
            better = err < error  # per group
            codes = torch.where(better, c, codes)
            scale = torch.where(better, sc, scale)
            error = torch.minimum(err, error)
        data = {
            "codes": pack_bits(codes.reshape(x.shape), self.bits),  # (B, H, S, D*bits/8)
            "scale": scale.squeeze(axis),  # (B, H, S, D/g) or (B, H, S/g, D)
        }
        return Encoded(data, tuple(x.shape), x.dtype)

    def _fit(self, xg: torch.Tensor, axis: int, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Nearest-level codes of the groups xg under fp16(scale): (codes, fp16 scale, squared error)."""
        scale = scale.half()
        s = scale.float()
        unit = torch.where(s > 0, xg / s, torch.zeros_like(xg))
        codes = torch.bucketize(unit, thresholds(self.bits, xg.device))
        error = (codebook(self.bits, xg.device)[codes] * s - xg).square().sum(axis, keepdim=True)
        return codes, scale, error

    def decode(self, enc: Encoded) -> torch.Tensor:
        """x = codebook[code] * scale, as (B, H, S, D) in the original dtype."""
        codes = unpack_bits(enc.data["codes"], self.bits)  # (B, H, S, D)
        levels = codebook(self.bits, codes.device)[codes]
        lg, axis = grouped(levels, self.group, self.per_channel)
        out = lg * enc.data["scale"].float().unsqueeze(axis)
        return out.reshape(enc.shape).to(enc.dtype)

    def nbytes(self, enc: Encoded) -> int:
        """Codes and scales."""
        return enc.nbytes

    def row_layout(self) -> RowLayout:
        """Rows of codebook indices: x = codebook[code] * scale, no offset."""
        rows = QuantRows(
            self.bits, self.group, self.per_channel,
            levels=tuple(codebook(self.bits).tolist()),
            thresholds=tuple(thresholds(self.bits).tolist()),
            scale_multiples=tuple(float(m) for m in self.scales),
        )
        return RowLayout(rows, leaf=self)
