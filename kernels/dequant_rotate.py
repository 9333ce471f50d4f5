"""dequant_rotate: unpack codes, dequantize and rotate back, in one pass (the inverse of rotate_quant).

Reads what `codecs.Rotation(inner)` (or a bare GroupQuant / LloydMaxQuant) stores and writes the
(B, H, S, D) tokens its decode returns: x = (level[code] * scale (+ zero)) @ Q.T, a tile of tokens
per program, the rotated rows living only in registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from codeckv.codecs.layout import Codec, Encoded, RowLayout

from .layout import layout_of, levels, rotation, tensors
from .triton_helpers import (
    Launch,
    load_rows,
    loadable,
    pow2,
    quant_meta,
    rotation_slab,
    rotation_slab_width,
    row_strides,
)

TOKENS_PER_TILE = 16  # tokens per program (32 spilled: kernels.compile_check)


@triton.jit
def _dequant_rotate_kernel(
    codes_ptr,  # (B, H, S, D*bits/8) uint8 packed codes
    scale_ptr, offset_ptr,  # fp16 scales / zeros (zeros for GroupQuant only)
    lut_ptr,  # (2**bits,) float32 Lloyd-Max levels (LLOYD only)
    rot_ptr,  # (D, D) float32 rotation Q (ROTATE only)
    out_ptr,  # (B, H, S, D) decoded tokens, contiguous, in the original dtype
    n_heads, n_tokens,  # H, S
    c_sb, c_sh, c_sr,  # codes strides (batch, head, token)
    s_sb, s_sh, s_sr,  # scale / zero strides (batch, head, row)
    BLOCK_T: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr, ROTATE: tl.constexpr, SLAB: tl.constexpr,
    RAW: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, PER_CHANNEL: tl.constexpr,
    HAS_OFFSET: tl.constexpr, LLOYD: tl.constexpr, RAW_FMT: tl.constexpr, SCALE_FMT: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_t = tl.program_id(1)
    b = (pid_bh // n_heads).to(tl.int64)
    h = (pid_bh % n_heads).to(tl.int64)
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]  # (BLOCK_T, 1)
    d = tl.arange(0, D_P)[None, :]  # (1, D_P)
    mask = (t < n_tokens) & (d < D)
    codes_base = codes_ptr + b * c_sb + h * c_sh
    scale_base = scale_ptr + b * s_sb + h * s_sh
    offset_base = offset_ptr + b * s_sb + h * s_sh
    if ROTATE:  # x = y @ Q.T, one slab of SLAB channels of y at a time (D is a power of two)
        y = tl.zeros((BLOCK_T, D_P), dtype=tl.float32)
        for c0 in tl.static_range(0, D, SLAB):
            part = load_rows(codes_base, scale_base, offset_base, lut_ptr, t, c0 + tl.arange(0, SLAB)[None, :],
                             t < n_tokens, c_sr, s_sr, RAW, BITS, GROUP, PER_CHANNEL, HAS_OFFSET, LLOYD, RAW_FMT,
                             SCALE_FMT)
            y += tl.dot(part, rotation_slab(rot_ptr, c0, SLAB, D, True), input_precision="ieee")
    else:
        y = load_rows(codes_base, scale_base, offset_base, lut_ptr, t, d, mask, c_sr, s_sr,
                      RAW, BITS, GROUP, PER_CHANNEL, HAS_OFFSET, LLOYD, RAW_FMT, SCALE_FMT)
    tl.store(out_ptr + (b * n_heads + h) * n_tokens * D + t * D + d, y.to(out_ptr.dtype.element_ty), mask=mask)


def dequant_rotate_supported(enc: Encoded, codec: Codec) -> bool:
    """True for a per-token layout of quantized rows, optionally rotated."""
    layout = layout_of(codec)
    d = enc.shape[-1]
    if not isinstance(layout, RowLayout) or layout.block != 1 or layout.quant is None:
        return False
    return layout.rotation is None or (d >= 16 and d & (d - 1) == 0)


def dequant_rotate_launch(enc: Encoded, codec: Codec) -> tuple[Launch, torch.Tensor]:
    """The launch that decodes an archive of `codec`, and the (B, H, S, D) output it fills."""
    if not dequant_rotate_supported(enc, codec):
        raise ValueError(f"dequant_rotate_triton: {codec!r} with head_dim {enc.shape[-1]} is not supported")
    b, h, s, d = enc.shape
    layout = layout_of(codec)
    spec = layout.quant
    codes, scale, offset = tensors(layout, enc)
    device = codes.device
    lut = levels(spec, device)
    rot = rotation(layout, d, device)
    out = torch.empty((b, h, s, d), dtype=enc.dtype, device=device)
    launch = Launch(_dequant_rotate_kernel, (b * h, triton.cdiv(s, TOKENS_PER_TILE)), (
        codes, loadable(scale), loadable(scale if offset is None else offset), lut, lut if rot is None else rot, out,
        h, s, *row_strides(codes), *row_strides(scale),
    ), dict(
        BLOCK_T=TOKENS_PER_TILE, D=d, D_P=pow2(d), ROTATE=rot is not None, SLAB=rotation_slab_width(d),
        num_warps=8 if rot is not None else 4,
        **quant_meta(spec, "", codes, scale),
    ))
    return launch, out


def dequant_rotate_triton(enc: Encoded, codec: Codec) -> torch.Tensor:
    """Decode an archive of `codec` with the Triton kernel: the same (B, H, S, D) as codec.decode(enc)."""
    launch, out = dequant_rotate_launch(enc, codec)
    launch()
    return out


def dequant_rotate_ref(enc: Encoded, codec: Codec) -> torch.Tensor:
    """The torch reference: the codec's own decode (the single source of truth for the format)."""
    return codec.decode(enc)
