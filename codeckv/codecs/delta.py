"""Per-block anchor + bit-pattern deltas: bitwise lossless (PNG-style).

Each block of r = block_size consecutive tokens stores its first token as is and
the other r - 1 as differences of consecutive bit patterns, per channel:

    p[t]     = x[t] viewed as a signed integer (int32 for float32, int16 for 16-bit)
    delta[t] = p[t] - p[t-1]  modulo 2**width (two's complement wrap-around)
    decode:  p[t] = anchor + cumulative sum of delta, modulo 2**width

Every bit pattern (inf, nan payloads, subnormals, -0.0) comes back exactly, and the
stored bytes equal the native bytes. The saving is entropy: neighbouring tokens
have close bit patterns, so deltas are small integers that a general-purpose
compressor shrinks; `entropy_nbytes` reports that size separately from `nbytes`.

Storage (`Encoded.data`), with nb = S / r blocks:

    anchor  (B, H, nb, D)        x.dtype             token 0 of each block
    delta   (B, H, nb*(r-1), D)  int32 | int16       row = block * (r-1) + (t - 1), t = 1..r-1
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import zstandard

from codeckv.codecs.base import Encoded, check_input
from codeckv.codecs.layout import NoRowLayout

BIT_PATTERN = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
ZSTD_LEVEL = 3


def _wrap(wide: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Reduce int64 values modulo 2**width into the signed range of `dtype` and cast."""
    width = torch.iinfo(dtype).bits
    half = 1 << (width - 1)
    return (torch.remainder(wide + half, 1 << width) - half).to(dtype)


def zstd_nbytes(t: torch.Tensor) -> int:
    """Bytes of t after byte-plane shuffling (as Blosc does) and zstandard at ZSTD_LEVEL."""
    raw = t.detach().cpu().contiguous().view(torch.uint8).reshape(-1, t.element_size())
    shuffled = raw.T.contiguous().numpy().tobytes()  # all low bytes, then all next bytes, ...
    return len(zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(shuffled))


@dataclass(frozen=True)
class Delta:
    """Anchor + wrap-around bit-pattern deltas per block of `block_size` tokens."""

    block_size: int = 8

    def __post_init__(self) -> None:
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"Delta: block_size={self.block_size!r} must be a positive integer (e.g. 8)")

    @property
    def block_tokens(self) -> int:
        """Encode whole blocks only."""
        return self.block_size

    def encode(self, x: torch.Tensor) -> Encoded:
        """Split x (B, H, S, D) into anchors and deltas; see the module docstring."""
        check_input(x, self.block_tokens, "Delta")
        if x.dtype not in BIT_PATTERN:
            raise ValueError(f"Delta: dtype {x.dtype} is not supported (allowed: {list(BIT_PATTERN)})")
        b, h, s, d = x.shape
        blocks = x.contiguous().reshape(b, h, s // self.block_size, self.block_size, d)
        patterns = blocks.view(BIT_PATTERN[x.dtype]).to(torch.int64)  # (B, H, nb, r, D)
        delta = _wrap(patterns[:, :, :, 1:] - patterns[:, :, :, :-1], BIT_PATTERN[x.dtype])
        data = {
            "anchor": blocks[:, :, :, 0].contiguous(),  # (B, H, nb, D)
            "delta": delta.reshape(b, h, -1, d),  # (B, H, nb*(r-1), D)
        }
        return Encoded(data, tuple(x.shape), x.dtype)

    def decode(self, enc: Encoded) -> torch.Tensor:
        """Anchor plus running sum of deltas, bit for bit: (B, H, S, D) in the original dtype."""
        b, h, s, d = enc.shape
        pattern = BIT_PATTERN[enc.dtype]
        anchor = enc.data["anchor"].view(pattern).to(torch.int64).unsqueeze(3)  # (B, H, nb, 1, D)
        delta = enc.data["delta"].to(torch.int64).reshape(b, h, s // self.block_size, -1, d)
        patterns = torch.cat([anchor, anchor + delta.cumsum(3)], dim=3)  # (B, H, nb, r, D)
        return _wrap(patterns, pattern).view(enc.dtype).reshape(b, h, s, d)

    def nbytes(self, enc: Encoded) -> int:
        """Anchors and deltas: exactly the native bytes of the same tokens."""
        return enc.nbytes

    def row_layout(self) -> NoRowLayout:
        return NoRowLayout("png stores integer deltas of bit patterns: a token needs the running sum of its block")

    def entropy_nbytes(self, enc: Encoded) -> int:
        """What the stored tensors take after byte shuffling + zstandard (the real lossless saving)."""
        return sum(zstd_nbytes(t) for t in enc.data.values())
