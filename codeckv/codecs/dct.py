"""Block DCT-II along the sequence axis, keeping the k lowest frequencies (JPEG-style).

Tokens are cut into blocks of r = block_size consecutive tokens. Each block of each
channel is transformed by the orthonormal DCT-II basis

    M[j, n] = c_j * cos(pi / r * (n + 1/2) * j),  c_0 = sqrt(1/r), c_j = sqrt(2/r)
    coeffs = M[:k] @ block          # (k, D) from (r, D)
    block ~= M[:k].T @ coeffs       # exact (up to float rounding) when k == r

Storage (`Encoded.data`), with nb = S / r blocks and row = block * k + frequency:

    coeffs  (B, H, nb*k, D)  x.dtype      when coeffs=None

or, when a quantizer is given as `coeffs` (e.g. GroupQuant(bits=8)), the float32
coefficient tensor (B, H, nb*k, D) is encoded by it and its tensors are stored
under prefixed names, e.g. `coeffs.codes`, `coeffs.scale`, `coeffs.zero`, with the
shapes and packing that quantizer documents for S = nb*k rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from codeckv.codecs.base import Codec, Encoded, check_input
from codeckv.codecs.layout import NoRowLayout, RawRows, RowLayout, dct_basis

PREFIX = "coeffs."
MAX_BLOCK = 64  # tokens per block: longer blocks only blur more, and cost O(r^2) per block


@dataclass(frozen=True)
class DCT:
    """Keep the k lowest DCT frequencies of every block of `block_size` tokens."""

    block_size: int = 8
    k: int = 8
    coeffs: Codec | None = None

    def __post_init__(self) -> None:
        if (isinstance(self.block_size, bool) or not isinstance(self.block_size, int)
                or not 1 <= self.block_size <= MAX_BLOCK):
            raise ValueError(f"DCT: block_size={self.block_size!r} must be a whole number in 1..{MAX_BLOCK} (e.g. 8)")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or not 1 <= self.k <= self.block_size:
            raise ValueError(
                f"DCT: k={self.k!r} frequencies kept must be an integer in 1..block_size="
                f"{self.block_size} (allowed: {list(range(1, self.block_size + 1))})"
            )
        if self.coeffs is not None and not isinstance(self.coeffs, Codec):
            raise ValueError(
                f"DCT: coeffs={self.coeffs!r} is not a codec (allowed: None or a quantizer such as GroupQuant(bits=8))"
            )

    @property
    def block_tokens(self) -> int:
        """A whole number of blocks whose nb*k coefficient rows also fill the inner codec's blocks."""
        if self.coeffs is None:
            return self.block_size
        inner = self.coeffs.block_tokens
        return self.block_size * inner // math.gcd(self.k, inner)

    def basis(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """M (k, block_size) float32: coeffs = M @ block, block ~= M.T @ coeffs."""
        return dct_basis(self.block_size, self.k, device)

    def encode(self, x: torch.Tensor) -> Encoded:
        """Transform every block of x (B, H, S, D) and keep k coefficient rows per block."""
        check_input(x, self.block_tokens, "DCT")
        b, h, s, d = x.shape
        blocks = x.float().reshape(b, h, s // self.block_size, self.block_size, d)
        coeffs = torch.einsum("kr,bhnrd->bhnkd", self.basis(x.device), blocks)
        coeffs = coeffs.reshape(b, h, -1, d)  # (B, H, nb*k, D)
        if self.coeffs is None:
            return Encoded({"coeffs": coeffs.to(x.dtype)}, tuple(x.shape), x.dtype)
        inner = self.coeffs.encode(coeffs)
        data = {PREFIX + name: t for name, t in inner.data.items()}
        return Encoded(data, tuple(x.shape), x.dtype)

    def decode(self, enc: Encoded) -> torch.Tensor:
        """Inverse DCT of the kept frequencies: (B, H, S, D) in the original dtype."""
        b, h, s, d = enc.shape
        nb = s // self.block_size
        if self.coeffs is None:
            coeffs = enc.data["coeffs"].float()
        else:
            inner = {name[len(PREFIX) :]: t for name, t in enc.data.items()}
            coeffs = self.coeffs.decode(Encoded(inner, (b, h, nb * self.k, d), torch.float32))
        coeffs = coeffs.reshape(b, h, nb, self.k, d)
        blocks = torch.einsum("kr,bhnkd->bhnrd", self.basis(coeffs.device), coeffs)
        return blocks.reshape(b, h, s, d).to(enc.dtype)

    def nbytes(self, enc: Encoded) -> int:
        """Coefficients, or the inner quantizer's codes, scales and zeros."""
        return enc.nbytes

    def row_layout(self) -> RowLayout | NoRowLayout:
        """k rows per block of block_size tokens: raw coefficients, or the inner codec's rows under "coeffs."."""
        if self.coeffs is None:
            return RowLayout(RawRows("coeffs"), block=self.block_size, k=self.k)
        inner = self.coeffs.row_layout()
        return inner if isinstance(inner, NoRowLayout) else inner.within(self.block_size, self.k, PREFIX)
