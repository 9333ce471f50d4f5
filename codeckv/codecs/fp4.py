"""FP4 microscaling: 4-bit floats (E2M1) in blocks of channels, each block with an 8-bit scale (OCP MX, NVIDIA NVFP4).

    FP4(block=32, scale_format="e8m0")   # MXFP4: a power-of-two scale per 32 values (the OCP MX spec)
    FP4(block=16, scale_format="e4m3")   # NVFP4: an FP8 E4M3 scale per 16 values (Blackwell's KV cache format)

An E2M1 element is a sign and one of 0, 0.5, 1, 1.5, 2, 3, 4, 6. Per block of `block` channels of a token:

    MXFP4   scale = 2^(floor(log2(amax)) - 2), stored as float8_e8m0fnu (a biased exponent); the spec's rule, so
            the largest values, up to 8 x scale, saturate at 6 x scale
    NVFP4   scale = amax / 6 rounded to float8_e4m3fn; NVFP4's second level, a per-tensor FP32 scale, is 1.0 here
            (the static scale an engine keeps beside the weights, as FP8's)

then each value / scale goes to the nearest E2M1 value (saturating at 6). Decode: level[code] * scale.

Storage (`Encoded.data`), G = D / block:

    codes  (B, H, S, D/2)  uint8          two 4-bit codes a byte, LSB first (codecs/bitpack.py): sign << 3 | index
    scale  (B, H, S, G)    float8_e8m0fnu (MXFP4) or float8_e4m3fn (NVFP4)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codeckv.codecs.base import Encoded, check_input
from codeckv.codecs.bitpack import pack_bits, unpack_uint8
from codeckv.codecs.layout import QuantRows, RowLayout

MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # E2M1, codes 0..7; codes 8..15 are their negatives
LEVELS = MAGNITUDES + tuple(-m for m in MAGNITUDES)
SCALE_FORMATS = {"e8m0": torch.float8_e8m0fnu, "e4m3": torch.float8_e4m3fn}
BLOCKS = (16, 32)


@dataclass(frozen=True)
class FP4:
    """E2M1 values with one 8-bit scale per `block` channels of a token (module docstring)."""

    block: int = 32
    scale_format: str = "e8m0"

    def __post_init__(self) -> None:
        if self.block not in BLOCKS:
            raise ValueError(f"FP4: block={self.block!r} is not supported (allowed: {BLOCKS})")
        if self.scale_format not in SCALE_FORMATS:
            raise ValueError(f"FP4: scale_format={self.scale_format!r} is not supported "
                             f"(allowed: {', '.join(SCALE_FORMATS)})")

    @property
    def block_tokens(self) -> int:
        return 1

    def _check(self, x: torch.Tensor) -> None:
        check_input(x, 1, "FP4")
        if x.shape[-1] % self.block:
            raise ValueError(f"FP4: head_dim={x.shape[-1]} does not split into blocks of {self.block} "
                             f"(allowed: head_dim a multiple of {self.block})")

    def encode(self, x: torch.Tensor) -> Encoded:
        self._check(x)
        b, h, s, d = x.shape
        y = x.float().reshape(b, h, s, d // self.block, self.block)
        amax = y.abs().amax(-1, keepdim=True)  # (B, H, S, G, 1)
        if self.scale_format == "e8m0":  # OCP MX: shared exponent floor(log2 amax) - emax(E2M1) = 2
            exponent = torch.floor(torch.log2(amax.clamp_min(2.0**-126))) - 2
            scale = torch.exp2(exponent.clamp(-127, 127)).to(SCALE_FORMATS["e8m0"])
        else:
            scale = (amax / 6).to(SCALE_FORMATS["e4m3"])
        step = scale.float()
        ratio = torch.where(step > 0, y / step, torch.zeros_like(y)).clamp(-6, 6)
        index = torch.bucketize(ratio.abs(), _thresholds(ratio.device))  # nearest magnitude
        codes = index + 8 * (ratio < 0)
        data = {"codes": pack_bits(codes.reshape(b, h, s, d), 4), "scale": scale.squeeze(-1)}
        return Encoded(data, tuple(x.shape), x.dtype)

    def decode(self, enc: Encoded) -> torch.Tensor:
        b, h, s, d = enc.shape
        codes = unpack_uint8(enc.data["codes"], 4).long().reshape(b, h, s, d // self.block, self.block)
        values = _levels(codes.device)[codes] * enc.data["scale"].float().unsqueeze(-1)
        return values.reshape(enc.shape).to(enc.dtype)

    def nbytes(self, enc: Encoded) -> int:
        return enc.nbytes

    def row_layout(self) -> RowLayout:
        """4-bit codebook codes (the E2M1 levels) times an 8-bit float scale per block of channels."""
        return RowLayout(QuantRows(4, self.block, per_channel=False, levels=LEVELS), leaf=self)


def _thresholds(device: torch.device) -> torch.Tensor:
    """Midpoints between the E2M1 magnitudes: bucketize maps |y| to its nearest one (a tie to the smaller)."""
    mids = [(a + b) / 2 for a, b in zip(MAGNITUDES, MAGNITUDES[1:])]
    return torch.tensor(mids, dtype=torch.float32, device=device)


def _levels(device: torch.device) -> torch.Tensor:
    return torch.tensor(LEVELS, dtype=torch.float32, device=device)

