"""The public ops: each dispatches on `tensor.is_cuda` to its Triton launcher or its torch reference.

    enc = encode(x, codec)      # any codec: the DCT or rotation/quantizer kernel on CUDA when its layout allows
    x = decode(enc, codec)      # else codec.encode / codec.decode (the reference everywhere)
    out = decode_attention(q, segments, scale, mask)  # Triton | decode_attention_torch | the reference
    attention_compiled(key_codec, value_codec, 64)     # True: on the CPU both sides run on codes_cpu
    backend_name("cuda", codec) # "triton", or "torch (why)" for a codec without a row layout
    op_backends(key_codec, value_codec, "cuda", head_dim=64)  # per op: which kernel, or torch and why

Imported lazily by kernels/__init__.py (see there why); use them as `kernels.<op>` in a checkout
(`codeckv_kernels.<op>` where the wheel is installed).
"""

from __future__ import annotations

import functools
import sys

import torch

from codeckv.codecs.layout import Codec, Encoded, NoRowLayout, RowLayout

from .codes_cpu import FLOAT8, MAX_DIM, codes_status
from .dct_decode import dct_decode_ref, dct_decode_supported, dct_decode_triton
from .dct_encode import dct_encode_ref, dct_encode_supported, dct_encode_triton
from .decode_attention import decode_attention_ref, decode_attention_supported, decode_attention_triton
from .decode_attention_torch import (
    decode_attention_torch,
    decode_attention_torch_compiled,
    decode_attention_torch_supported,
)
from .dequant_rotate import dequant_rotate_ref, dequant_rotate_supported, dequant_rotate_triton
from .layout import layout_of
from .rotate_quant import rotate_quant_ref, rotate_quant_supported, rotate_quant_triton
from .segments import Coded, Raw, Segment
from .triton_helpers import encoder_writes

__all__ = [  # re-exported by kernels/__init__.py
    "Coded",
    "Raw",
    "Segment",
    "attention_compiled",
    "backend_name",
    "dct_decode",
    "dct_encode",
    "decode",
    "decode_attention",
    "dequant_rotate",
    "encode",
    "op_backends",
    "rotate_quant",
]
FLOAT_INPUTS = (torch.float32, torch.float16, torch.bfloat16)  # what the Triton encoders read


def backend_name(device: torch.device | str | None = None, codec: Codec | None = None) -> str:
    """Which path tensors on `device` (default: CUDA if present, else CPU) take, for `codec` if given.

    "triton" on CUDA; "torch" on CPU; "torch (reason)" on CUDA for a codec whose layout no kernel reads.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if torch.device(device).type != "cuda":
        return "torch"
    layout = layout_of(codec) if codec is not None else None
    return f"torch ({layout.reason})" if isinstance(layout, NoRowLayout) else "triton"


def op_backends(
    key_codec: Codec, value_codec: Codec, device: torch.device | str, head_dim: int, dtype: torch.dtype = torch.float32
) -> dict[str, str]:
    """The path each op takes for this key/value codec pair on `device`, and why wherever it is torch.

    Keys "encode K", "encode V", "decode K", "decode V" (archiving and the decoded view) and "attention"
    (decode_attention on the codes, the materialization-free mode). Decided by the same `*_supported`
    checks the ops run, on a one-block sample of `head_dim` channels in `dtype`.
    """
    on_cuda = torch.device(device).type == "cuda"
    paths, stored = {}, {}
    for side, codec in (("K", key_codec), ("V", value_codec)):
        x = torch.zeros(1, 1, codec.block_tokens, head_dim, dtype=dtype)
        try:
            enc = stored[side] = codec.encode(x)
        except ValueError as err:  # the codec itself refuses this shape: no op runs at all
            return dict.fromkeys(("encode K", "decode K", "encode V", "decode V", "attention"), f"none ({err})")
        if not on_cuda:
            paths[f"encode {side}"] = paths[f"decode {side}"] = "torch (no CUDA device)"
            continue
        encoder = "dct_encode" if dct_encode_supported(x, codec) else "rotate_quant" if rotate_quant_supported(
            x, codec) else None
        decoder = "dct_decode" if dct_decode_supported(enc, codec) else "dequant_rotate" if dequant_rotate_supported(
            enc, codec) else None
        why = _why_no_kernel(layout_of(codec), head_dim, dtype)
        paths[f"encode {side}"] = f"triton {encoder}" if encoder else f"torch ({why})"
        paths[f"decode {side}"] = f"triton {decoder}" if decoder else f"torch ({why})"
    coded = [Coded(key_codec, stored["K"], value_codec, stored["V"])]
    if on_cuda and decode_attention_supported(coded):
        paths["attention"] = "triton decode_attention (torch where a mask is given: a left-padded batch)"
    elif decode_attention_torch_supported(coded):
        reason = "no CUDA device" if not on_cuda else "keys and values differ in block geometry (r, k)"
        paths["attention"] = f"torch decode_attention_torch ({reason}{_compiled_part(coded[0], head_dim, on_cuda)})"
    else:
        unread = [layout_of(c) for c in (key_codec, value_codec) if isinstance(layout_of(c), NoRowLayout)]
        reasons = {layout.reason for layout in unread} or {_why_no_kernel(layout_of(c), head_dim, dtype)
                                                           for c in (key_codec, value_codec)}
        paths["attention"] = f"torch reference, decodes first ({'; '.join(sorted(reasons))})"
    return paths


def _compiled_part(segment: Coded, head_dim: int, on_cuda: bool) -> str:
    """What the compiled CPU kernel does in decode_attention_torch for this pair (a clause of op_backends')."""
    if on_cuda:
        return ""
    compiled = decode_attention_torch_compiled(segment, head_dim)
    sides = [side for side, yes in zip(("keys", "values"), compiled) if yes]
    status = codes_status()
    if len(sides) == 2:
        return f"; keys and values read on their codes by codes_cpu, {status}"
    if status.startswith("torch"):
        return f"; float rows a piece at a time: {status}"
    why = "; ".join(f"{side}: {_why_not_compiled(codec, head_dim)}" for side, codec, yes in zip(
        ("keys", "values"), (segment.key_codec, segment.value_codec), compiled) if not yes)
    done = f"{sides[0]} read on their codes by codes_cpu, " if sides else ""
    return f"; {done}float rows a piece at a time ({why})"


def _why_not_compiled(codec: Codec, head_dim: int) -> str:
    """Why the compiled CPU kernel does not read this codec's codes (it reads every other row layout)."""
    layout = layout_of(codec)
    if layout.block > 1:
        return "the compiled kernel reads no DCT coefficients"
    spec = layout.quant
    if spec is None and layout.rows.dtype in FLOAT8:
        return f"8-bit float rows at head_dim {head_dim} (the compiled kernel takes multiples of 16 up to {MAX_DIM})"
    if spec is None:
        return "raw rows that are not 8-bit floats"
    return f"the compiled kernel does not read {'Lloyd-Max ' if spec.lloyd_max else ''}{spec.bits}-bit codes at " \
           f"head_dim {head_dim} in groups of {spec.group}"


@functools.cache
def attention_compiled(key_codec: Codec, value_codec: Codec, head_dim: int) -> bool:
    """True when decode_attention on CPU tensors multiplies both sides on their codes in the compiled kernel
    (kernels/codes_cpu.py): it then makes no float row, and a short context reads its codes about as fast
    as SDPA reads a decoded view (a decode step, G <= codes_cpu.MAX_ROWS query heads per KV head)."""
    stored = [codec.encode(torch.zeros(1, 1, codec.block_tokens, head_dim)) for codec in (key_codec, value_codec)]
    segment = Coded(key_codec, stored[0], value_codec, stored[1])
    return decode_attention_torch_supported([segment]) and all(decode_attention_torch_compiled(segment, head_dim))


def _why_no_kernel(layout: RowLayout | NoRowLayout, head_dim: int, dtype: torch.dtype) -> str:
    """Why the Triton encoders / decoders do not take this layout (the first condition of theirs it fails)."""
    if isinstance(layout, NoRowLayout):
        return layout.reason
    spec = layout.quant
    if layout.block == 1 and spec is None:
        return "raw per-token rows: a plain cast, no kernel"
    if spec is not None and spec.codec_encodes:
        return "codes chosen by the codec's own rule (vLLM's rounding): the codec encodes them, the kernels read them"
    if not encoder_writes(spec):
        return "a codebook scaled by the format's own rule (E2M1): the codec encodes it, the kernels read it"
    if dtype not in FLOAT_INPUTS:
        return f"{dtype} tokens (the kernels read float32, float16, bfloat16)"
    if spec is not None and not (spec.packs(head_dim) and spec.fits(head_dim)):
        return f"{spec.bits}-bit codes do not tile head_dim {head_dim} into whole bytes and groups of {spec.group}"
    if layout.rotation is not None and not (head_dim >= 16 and head_dim & (head_dim - 1) == 0):
        return f"the rotation needs head_dim a power of two >= 16, not {head_dim}"
    return "no kernel for this layout"


def _stored_on_cuda(enc: Encoded) -> bool:
    return next(iter(enc.data.values())).is_cuda


def encode(x: torch.Tensor, codec: Codec) -> Encoded:
    """codec.encode(x) for x (B, H, S, D): through dct_encode or rotate_quant on CUDA when they support it."""
    if x.is_cuda:
        if dct_encode_supported(x, codec):
            return dct_encode_triton(x, codec)
        if rotate_quant_supported(x, codec):
            return rotate_quant_triton(x, codec)
    return codec.encode(x)


def decode(enc: Encoded, codec: Codec) -> torch.Tensor:
    """codec.decode(enc) -> (B, H, S, D): through dct_decode or dequant_rotate on CUDA when they support it."""
    if _stored_on_cuda(enc):
        if dct_decode_supported(enc, codec):
            return dct_decode_triton(enc, codec)
        if dequant_rotate_supported(enc, codec):
            return dequant_rotate_triton(enc, codec)
    return codec.decode(enc)


def dct_encode(x: torch.Tensor, codec: Codec) -> Encoded:
    """Block DCT + fused coefficient quantization of x (B, H, S, D): exactly codec.encode(x)'s tensors."""
    if x.is_cuda and dct_encode_supported(x, codec):
        return dct_encode_triton(x, codec)
    return dct_encode_ref(x, codec)


def dct_decode(enc: Encoded, codec: Codec) -> torch.Tensor:
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
    The Triton kernel on CUDA without a mask; else decode_attention_torch (few large torch ops, bounded
    memory) when every coded span declares a row layout; else the reference (it decodes png's deltas).
    """
    if query.is_cuda and mask is None and decode_attention_supported(segments):
        return decode_attention_triton(query, segments, scale)
    if decode_attention_torch_supported(segments):
        return decode_attention_torch(query, segments, scale, mask)
    return decode_attention_ref(query, segments, scale, mask)


# The op names are also submodule names (kernels/<op>.py), and importing a submodule sets the package
# attribute to it: bind the functions over them, as an eager kernels/__init__.py would.
vars(sys.modules[__package__]).update({name: globals()[name] for name in __all__})
