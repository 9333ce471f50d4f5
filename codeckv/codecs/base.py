"""The codec contract shared by every codec: `Encoded` and the `Codec` protocol.

A codec compresses KV tensors of shape (B, H, S, D) — batch, KV heads, sequence,
head_dim — and is a small `@dataclass` whose fields are its parameters:

    enc = codec.encode(x)        # x: (B, H, S, D), S a multiple of codec.block_tokens
    y = codec.decode(enc)        # (B, H, S, D), same dtype as x
    n = codec.nbytes(enc)        # every byte stored: codes, scales, zeros, anchors
    codec.row_layout()           # how kernels read the stored rows, or why none can (codecs/layout.py)

Layout rule that lets the cache append archives chunk by chunk: every tensor in
`Encoded.data` has shape (B, H, N, ...) where N is proportional to the number of
tokens encoded (tokens, blocks, or coefficient rows), so two `Encoded` of the same
codec concatenate along dim 2 into the `Encoded` of the concatenated tokens, and
`slice_encoded` cuts whole blocks back out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass
class Encoded:
    """What a codec stores for S tokens: named tensors only (shape/dtype are O(1) metadata)."""

    data: dict[str, torch.Tensor]
    shape: tuple[int, int, int, int]  # (B, H, S, D) of the original tensor
    dtype: torch.dtype  # dtype of the original tensor, restored by decode

    @property
    def nbytes(self) -> int:
        """Bytes of every stored tensor: numel * element_size, summed."""
        return sum(t.numel() * t.element_size() for t in self.data.values())


@runtime_checkable
class Codec(Protocol):
    """What the cache needs from a codec (see module docstring)."""

    @property
    def block_tokens(self) -> int:
        """Encode only accepts S that is a multiple of this (1 for per-token codecs)."""
        ...

    def encode(self, x: torch.Tensor) -> Encoded: ...

    def decode(self, enc: Encoded) -> torch.Tensor: ...

    def nbytes(self, enc: Encoded) -> int: ...

    def row_layout(self):
        """How the kernels read what this codec stores: a RowLayout, or NoRowLayout(reason) (codecs/layout.py)."""
        ...


def check_input(x: torch.Tensor, block_tokens: int, name: str) -> None:
    """Raise a clear ValueError unless x is (B, H, S, D) with S a multiple of block_tokens."""
    if x.dim() != 4:
        raise ValueError(f"{name}: expected a (B, H, S, D) tensor, got shape {tuple(x.shape)}")
    if x.shape[2] % block_tokens:
        raise ValueError(
            f"{name}: sequence length {x.shape[2]} is not a multiple of block_tokens={block_tokens}"
        )


def concat_encoded(encs: list[Encoded]) -> Encoded:
    """Join archives of consecutive token chunks: every tensor concatenated along dim 2."""
    if not encs:
        raise ValueError("concat_encoded: expected at least one Encoded, got none")
    first = encs[0]
    data = {name: torch.cat([e.data[name] for e in encs], dim=2) for name in first.data}
    b, h, _, d = first.shape
    return Encoded(data, (b, h, sum(e.shape[2] for e in encs), d), first.dtype)


def slice_encoded(enc: Encoded, start: int, stop: int) -> Encoded:
    """Tokens [start, stop) of an Encoded, as views: every tensor is sliced proportionally along dim 2.

    start and stop must be multiples of the codec's block_tokens (whole blocks / quantization groups).
    """
    b, h, s, d = enc.shape
    if not 0 <= start <= stop <= s:
        raise ValueError(f"slice_encoded: tokens [{start}, {stop}) are outside the {s} tokens encoded")
    data = {}
    for name, t in enc.data.items():
        lo, hi = t.shape[2] * start, t.shape[2] * stop
        if lo % s or hi % s:
            raise ValueError(f"slice_encoded: tokens [{start}, {stop}) cut a stored row of '{name}'")
        data[name] = t[:, :, lo // s : hi // s]
    return Encoded(data, (b, h, stop - start, d), enc.dtype)


def split_heads(enc: Encoded, heads: list[int]) -> list[Encoded]:
    """Cut an Encoded of (B, sum(heads), S, D) tokens into one Encoded per run of heads, as views along dim 1."""
    b, _, s, d = enc.shape
    parts = {name: t.split(heads, dim=1) for name, t in enc.data.items()}
    return [Encoded({name: p[i] for name, p in parts.items()}, (b, h, s, d), enc.dtype) for i, h in enumerate(heads)]
