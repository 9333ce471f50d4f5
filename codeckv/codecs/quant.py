"""b-bit asymmetric min/max group quantization with fp16 scales and zeros, bit-packed.

Two grouping modes over x (B, H, S, D):

- per token (default): each token's head_dim is cut into D/group groups of `group`
  channels. Good for values; block_tokens = 1.
- per channel (KIVI-style, for keys): each channel is cut into S/group groups of
  `group` consecutive tokens, so a channel's outliers and offset get their own
  scale and zero. block_tokens = group.

Storage (`Encoded.data`), with G = D/group (per token) or S/group rows (per channel):

    codes  (B, H, S, D*bits/8)  uint8    codes along head_dim, packed LSB-first (see bitpack)
    scale  (B, H, S, D/group)   float16  per token      | (B, H, S/group, D) per channel
    zero   (B, H, S, D/group)   float16  per token      | (B, H, S/group, D) per channel

Decode: x = code * scale + zero, with code in [0, 2**bits - 1]. Encode computes the
codes from the fp16-rounded scale and zero, so decode reproduces encode's grid.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codeckv.codecs.base import Encoded, check_input
from codeckv.codecs.bitpack import check_bits, pack_bits, pack_unit, unpack_uint8
from codeckv.codecs.layout import QuantRows, RowLayout


def check_group(group: int, name: str) -> None:
    """Raise ValueError unless group is a positive integer."""
    if isinstance(group, bool) or not isinstance(group, int) or group <= 0:
        raise ValueError(f"{name}: group={group!r} must be a positive integer (e.g. 32, 64)")


def check_row(shape: tuple[int, ...], bits: int, group: int, per_channel: bool, name: str) -> None:
    """Raise ValueError unless head_dim packs into whole bytes and (per token) splits into groups."""
    head_dim = shape[-1]
    unit = pack_unit(bits)[0]
    if head_dim % unit:
        raise ValueError(
            f"{name}: head_dim={head_dim} at bits={bits} does not pack into whole bytes "
            f"(head_dim must be a multiple of {unit})"
        )
    if not per_channel and head_dim % group:
        divisors = [g for g in range(1, head_dim + 1) if head_dim % g == 0]
        raise ValueError(f"{name}: group={group} must divide head_dim={head_dim} (allowed: {divisors})")


def grouped(x: torch.Tensor, group: int, per_channel: bool) -> tuple[torch.Tensor, int]:
    """View (B, H, S, D) as groups; return the view and the axis a group spans.

    per token:   (B, H, S, D/group, group), axis 4
    per channel: (B, H, S/group, group, D), axis 3
    """
    b, h, s, d = x.shape
    if per_channel:
        return x.reshape(b, h, s // group, group, d), 3
    return x.reshape(b, h, s, d // group, group), 4


@dataclass(frozen=True)
class GroupQuant:
    """Asymmetric min/max quantization to `bits` bits per value in groups of `group`."""

    bits: int = 4
    group: int = 32
    per_channel: bool = False

    def __post_init__(self) -> None:
        check_bits(self.bits, "GroupQuant")
        check_group(self.group, "GroupQuant")

    @property
    def block_tokens(self) -> int:
        """Per-channel groups span `group` tokens; per-token groups need no block."""
        return self.group if self.per_channel else 1

    def encode(self, x: torch.Tensor) -> Encoded:
        """Quantize x (B, H, S, D) group by group; see the module docstring for the layout."""
        check_input(x, self.block_tokens, "GroupQuant")
        check_row(tuple(x.shape), self.bits, self.group, self.per_channel, "GroupQuant")
        levels = (1 << self.bits) - 1
        xg, axis = grouped(x.float(), self.group, self.per_channel)
        lo = xg.amin(axis, keepdim=True)
        hi = xg.amax(axis, keepdim=True)
        zero = lo.half()
        scale = ((hi - zero.float()) / levels).half()
        z, s = zero.float(), scale.float()
        q = torch.where(s > 0, (xg - z) / s, torch.zeros_like(xg))
        codes = q.round().clamp_(0, levels).reshape(x.shape)  # (B, H, S, D)
        data = {
            "codes": pack_bits(codes, self.bits),  # (B, H, S, D*bits/8)
            "scale": scale.squeeze(axis),  # (B, H, S, D/g) or (B, H, S/g, D)
            "zero": zero.squeeze(axis),
        }
        return Encoded(data, tuple(x.shape), x.dtype)

    def decode(self, enc: Encoded) -> torch.Tensor:
        """x = code * scale + zero, returned as (B, H, S, D) in the original dtype."""
        codes = unpack_uint8(enc.data["codes"], self.bits).float()  # (B, H, S, D)
        cg, axis = grouped(codes, self.group, self.per_channel)
        scale = enc.data["scale"].float().unsqueeze(axis)
        zero = enc.data["zero"].float().unsqueeze(axis)
        return (cg * scale + zero).reshape(enc.shape).to(enc.dtype)

    def nbytes(self, enc: Encoded) -> int:
        """Codes, scales and zeros."""
        return enc.nbytes

    def row_layout(self) -> RowLayout:
        """Rows of integer codes: x = code * scale + zero."""
        return RowLayout(QuantRows(self.bits, self.group, self.per_channel, offset="zero"), leaf=self)
