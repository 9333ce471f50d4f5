"""The public ops: each dispatches on `tensor.is_cuda` to its Triton launcher or its torch reference.

Imported lazily by kernels/__init__.py (see there why); use them as `kernels.<op>`.
"""

from __future__ import annotations

import sys

import torch

from codeckv.codecs.base import Codec, Encoded
from codeckv.codecs.dct import DCT
from kernels.dct_decode import dct_decode_ref, dct_decode_supported, dct_decode_triton
from kernels.dct_encode import dct_encode_ref, dct_encode_supported, dct_encode_triton
from kernels.decode_attention import (
    Coded,
    Raw,
    Segment,
    decode_attention_ref,
    decode_attention_supported,
    decode_attention_triton,
)
from kernels.dequant_rotate import dequant_rotate_ref, dequant_rotate_supported, dequant_rotate_triton
from kernels.rotate_quant import rotate_quant_ref, rotate_quant_supported, rotate_quant_triton

__all__ = [  # re-exported by kernels/__init__.py
    "Coded",
    "Raw",
    "Segment",
    "backend_name",
    "dct_decode",
    "dct_encode",
    "decode_attention",
    "dequant_rotate",
    "rotate_quant",
]


def backend_name(device: torch.device | str | None = None) -> str:
    """"triton" when tensors on `device` (default: CUDA if present, else CPU) run the kernels, else "torch"."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return "triton" if torch.device(device).type == "cuda" else "torch"


def _stored_on_cuda(enc: Encoded) -> bool:
    return next(iter(enc.data.values())).is_cuda


def dct_encode(x: torch.Tensor, codec: DCT) -> Encoded:
    """Block DCT + fused coefficient quantization of x (B, H, S, D): exactly codec.encode(x)'s tensors."""
    if x.is_cuda and dct_encode_supported(x, codec):
        return dct_encode_triton(x, codec)
    return dct_encode_ref(x, codec)


def dct_decode(enc: Encoded, codec: DCT) -> torch.Tensor:
    """Dequantize + inverse block DCT: codec.decode(enc), (B, H, S, D)."""
    if _stored_on_cuda(enc) and dct_decode_supported(enc, codec):
        return dct_decode_triton(enc, codec)
    return dct_decode_ref(enc, codec)


def rotate_quant(x: torch.Tensor, codec: Codec) -> Encoded:
    """Hadamard rotation + group quantization + bit-packing: exactly codec.encode(x)'s tensors."""
    if x.is_cuda and rotate_quant_supported(x, codec):
        return rotate_quant_triton(x, codec)
    return rotate_quant_ref(x, codec)


def dequant_rotate(enc: Encoded, codec: Codec) -> torch.Tensor:
    """Unpack + dequantize + rotate back: codec.decode(enc), (B, H, S, D)."""
    if _stored_on_cuda(enc) and dequant_rotate_supported(enc, codec):
        return dequant_rotate_triton(enc, codec)
    return dequant_rotate_ref(enc, codec)


def decode_attention(
    query: torch.Tensor,
    segments: list[Segment],
    scale: float | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of query (B, Hq, T, D) on stored segments without materializing K/V: (B, Hq, T, Dv).

    mask: None (every query sees every token) or (B, 1|Hq, T, S), bool (True = attend) or additive.
    """
    if query.is_cuda and mask is None and decode_attention_supported(segments):
        return decode_attention_triton(query, segments, scale)
    return decode_attention_ref(query, segments, scale, mask)


# The op names are also submodule names (kernels/<op>.py), and importing a submodule sets the package
# attribute to it: bind the functions over them, as an eager kernels/__init__.py would.
vars(sys.modules["kernels"]).update({name: globals()[name] for name in __all__})
