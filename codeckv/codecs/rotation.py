"""Random-sign Hadamard rotation along head_dim, wrapping a quantizer (TurboQuant-style).

An orthonormal rotation spreads a few outlier channels over all coordinates and
makes each coordinate close to Gaussian, so a scalar quantizer after it loses far
less. The rotation is fixed by `seed` and head_dim D:

    Q = diag(signs) @ Hadamard(D) / sqrt(D)        # (D, D), orthonormal; D a power of two
    Q = diag(signs) @ blockdiag(Hadamard(b), ...) / sqrt(b)   # other D: b the largest power of two dividing D
    encode: y = x @ Q, then inner.encode(y)        # x: (B, H, S, D) as rows
    decode: x = inner.decode(...) @ Q.T

Hadamard(D) is Sylvester's (+1/-1, symmetric); signs[j] in {+1, -1} are drawn by
torch.randint on a CPU generator seeded with `seed`, so Q is the same on every
device. The inner codec sees y in float32; its tensors are stored unchanged
(same names, shapes, dtypes as the inner codec documents), so a kernel reads the
inner layout and applies Q.T (see `matrix`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from codeckv.codecs.base import Codec, Encoded, check_input
from codeckv.codecs.layout import NoRowLayout, RowLayout
from codeckv.codecs.quant import GroupQuant


def sylvester(size: int) -> torch.Tensor:
    """Sylvester's Hadamard matrix of +1/-1, (size, size) float32 on CPU, size a power of two (symmetric)."""
    hadamard = torch.ones(1, 1)
    while hadamard.shape[0] < size:
        hadamard = torch.cat([torch.cat([hadamard, hadamard], 1), torch.cat([hadamard, -hadamard], 1)])
    return hadamard


@functools.cache
def _matrix(head_dim: int, seed: int) -> torch.Tensor:
    """Q = diag(signs) @ blockdiag(Hadamard(b), ...) / sqrt(b): (D, D) float32 on CPU, b the largest power of two
    dividing D (b = D for a power of two: one Hadamard over every channel)."""
    block = head_dim & -head_dim  # the largest power of two dividing head_dim
    hadamard = sylvester(block)
    generator = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (head_dim,), generator=generator).float() * 2 - 1  # (D,)
    return signs[:, None] * torch.block_diag(*[hadamard] * (head_dim // block)) / block**0.5


@dataclass(frozen=True)
class Rotation:
    """Rotate head_dim by a fixed random-sign Hadamard, then quantize with `inner`."""

    inner: Codec = field(default_factory=lambda: GroupQuant(bits=4))
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.inner, Codec):
            raise ValueError(
                f"Rotation: inner={self.inner!r} is not a codec "
                "(allowed: an object with block_tokens, encode, decode, nbytes, e.g. GroupQuant)"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"Rotation: seed={self.seed!r} must be a non-negative integer")

    @property
    def block_tokens(self) -> int:
        """Whatever the inner codec needs."""
        return self.inner.block_tokens

    def matrix(self, head_dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The orthonormal rotation Q (D, D) float32: encode applies x @ Q, decode y @ Q.T."""
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
            raise ValueError(f"Rotation: head_dim={head_dim!r} must be a positive integer")
        return _matrix(head_dim, self.seed).to(device)

    def encode(self, x: torch.Tensor) -> Encoded:
        """Rotate x (B, H, S, D) and encode the rotated rows with the inner codec."""
        check_input(x, self.block_tokens, "Rotation")
        q = self.matrix(x.shape[-1], x.device)
        inner = self.inner.encode(x.float() @ q)  # (B, H, S, D) float32
        return Encoded(inner.data, inner.shape, x.dtype)

    def decode(self, enc: Encoded) -> torch.Tensor:
        """Decode with the inner codec, then rotate back: (B, H, S, D) in the original dtype."""
        y = self.inner.decode(Encoded(enc.data, enc.shape, torch.float32))  # (B, H, S, D)
        return (y @ self.matrix(enc.shape[-1], y.device).T).to(enc.dtype)

    def nbytes(self, enc: Encoded) -> int:
        """Exactly the inner codec's tensors; the rotation itself stores nothing."""
        return enc.nbytes

    def row_layout(self) -> RowLayout | NoRowLayout:
        """The inner codec's rows, rotated by Q."""
        inner = self.inner.row_layout()
        return inner if isinstance(inner, NoRowLayout) else inner.rotated(self)
