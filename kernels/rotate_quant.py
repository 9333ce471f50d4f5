"""rotate_quant: random-sign Hadamard rotation, group quantization and bit-packing, in one pass.

Writes exactly the tensors `codecs.Rotation(inner).encode` stores — the inner GroupQuant's
`codes` / `scale` / `zero` or LloydMaxQuant's `codes` / `scale` (codecs/quant.py, lloyd_max.py) —
or, given a bare GroupQuant / LloydMaxQuant, that quantizer's tensors (no rotation). A program
loads a tile of tokens, rotates it with (rows, D) @ (D, D) products slab by slab, quantizes every group
(per token: `group` channels; per channel: one program per group of `group` tokens) and packs
the codes LSB-first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from codeckv.codecs.layout import Codec, Encoded, RowLayout, check_input

from .layout import layout_of, rotation
from .triton_helpers import (
    Launch,
    encoder_inputs,
    encoder_meta,
    encoder_writes,
    pow2,
    quant_outputs,
    quantize_pack,
    rotation_slab,
    rotation_slab_width,
    tile_layout,
)

TOKENS_PER_TILE = 16  # tokens per program with per-token groups


@triton.jit
def _rotate_quant_kernel(
    x_ptr,  # (B, H, S, D) tokens, any float dtype
    rot_ptr,  # (D, D) float32 rotation Q (ROTATE only)
    codes_ptr,  # (B, H, S, D*bits/8) uint8 packed codes
    scale_ptr, offset_ptr,  # fp16 scales and zeros (zeros for GroupQuant only)
    lut_ptr, thr_ptr, mult_ptr, n_mult, err_ptr, n_bins,  # Lloyd-Max tables (LLOYD only; encoder_inputs)
    n_heads, n_tokens,  # H, S
    x_sb, x_sh, x_ss,  # x strides (batch, head, token)
    c_sb, c_sh, c_sr,  # codes strides (batch, head, token)
    s_sb, s_sh, s_sr,  # scale / zero strides (batch, head, row)
    ROWS: tl.constexpr, R_P: tl.constexpr,  # tokens per program, padded to a power of two
    D: tl.constexpr, NG: tl.constexpr, NG_P: tl.constexpr, GW: tl.constexpr, GW_P: tl.constexpr,  # channel tiling
    BITS: tl.constexpr, PER_CHANNEL: tl.constexpr, LLOYD: tl.constexpr, ROTATE: tl.constexpr, SLAB: tl.constexpr,
    BIN_SCALE: tl.constexpr, REFIT: tl.constexpr,  # Lloyd-Max search (encoder_meta)
):
    pid_bh = tl.program_id(0)
    pid_t = tl.program_id(1)
    b = (pid_bh // n_heads).to(tl.int64)
    h = (pid_bh % n_heads).to(tl.int64)
    ri = tl.arange(0, R_P)[:, None, None]
    rows = pid_t * ROWS + ri  # (R_P, 1, 1) tokens
    gidx = tl.arange(0, NG_P)[None, :, None]
    tidx = tl.arange(0, GW_P)[None, None, :]
    chans = gidx * GW + tidx  # (1, NG_P, GW_P)
    mask = (ri < ROWS) & (rows < n_tokens) & (gidx < NG) & (tidx < GW)
    x_base = x_ptr + b * x_sb + h * x_sh
    if ROTATE:  # y = x @ Q, one slab of SLAB channels of x at a time (D is a power of two)
        rows2 = pid_t * ROWS + tl.arange(0, R_P)[:, None]
        ok2 = (tl.arange(0, R_P)[:, None] < ROWS) & (rows2 < n_tokens)
        y2 = tl.zeros((R_P, D), dtype=tl.float32)
        for c0 in tl.static_range(0, D, SLAB):
            part = tl.load(x_base + rows2 * x_ss + c0 + tl.arange(0, SLAB)[None, :], mask=ok2, other=0.0)
            y2 += tl.dot(part.to(tl.float32), rotation_slab(rot_ptr, c0, SLAB, D, False), input_precision="ieee")
        y = tl.reshape(y2, (R_P, NG_P, GW_P))
    else:
        y = tl.load(x_base + rows * x_ss + chans, mask=mask, other=0.0).to(tl.float32)
    quantize_pack(
        y, mask, rows, gidx, tidx, pid_t,
        codes_ptr + b * c_sb + h * c_sh, scale_ptr + b * s_sb + h * s_sh, offset_ptr + b * s_sb + h * s_sh,
        lut_ptr, thr_ptr, mult_ptr, n_mult, err_ptr, n_bins, c_sr, s_sr,
        GW, BITS, PER_CHANNEL, LLOYD, BIN_SCALE, REFIT,
    )


def rotate_quant_supported(x: torch.Tensor, codec: Codec) -> bool:
    """True for a per-token layout of quantized rows (optionally rotated) that the kernel can pack."""
    layout = layout_of(codec)
    d = x.shape[-1]
    if not isinstance(layout, RowLayout) or layout.block != 1 or layout.quant is None:
        return False
    if not (layout.quant.packs(d) and layout.quant.fits(d)) or not encoder_writes(layout.quant):
        return False
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    return layout.rotation is None or (d >= 16 and d & (d - 1) == 0)


def rotate_quant_launch(x: torch.Tensor, codec: Codec) -> tuple[Launch, Encoded]:
    """The launch that encodes x (B, H, S, D), and the Encoded of the outputs it fills."""
    check_input(x, codec.block_tokens, "rotate_quant")
    if not rotate_quant_supported(x, codec):
        raise ValueError(f"rotate_quant_triton: {codec!r} on {x.dtype} head_dim {x.shape[-1]} is not supported")
    x = x if x.stride(-1) == 1 else x.contiguous()
    b, h, s, d = x.shape
    layout = layout_of(codec)
    spec = layout.quant
    codes, scale, offset, data = quant_outputs(spec, (b, h, s, d), x.device, layout.prefix)
    tables = encoder_inputs(spec, x.device)
    rot = rotation(layout, d, x.device)
    rows = spec.group if spec.per_channel else TOKENS_PER_TILE
    launch = Launch(_rotate_quant_kernel, (b * h, triton.cdiv(s, rows)), (
        x, tables[0] if rot is None else rot, codes, scale, scale if offset is None else offset,
        *tables,
        h, s,
        x.stride(0), x.stride(1), x.stride(2),
        codes.stride(0), codes.stride(1), codes.stride(2),
        scale.stride(0), scale.stride(1), scale.stride(2),
    ), dict(
        ROWS=rows, R_P=max(pow2(rows), 16 if rot is not None else 1), D=d, **tile_layout(spec, d),
        BITS=spec.bits, PER_CHANNEL=spec.per_channel, LLOYD=spec.lloyd_max, ROTATE=rot is not None,
        SLAB=rotation_slab_width(d), **encoder_meta(spec),
        num_warps=8 if rot is not None else 4,
    ))
    return launch, Encoded(data, (b, h, s, d), x.dtype)


def rotate_quant_triton(x: torch.Tensor, codec: Codec) -> Encoded:
    """Encode x (B, H, S, D) with the Triton kernel: the same Encoded as codec.encode(x)."""
    launch, enc = rotate_quant_launch(x, codec)
    launch()
    return enc


def rotate_quant_ref(x: torch.Tensor, codec: Codec) -> Encoded:
    """The torch reference: the codec's own encode (the single source of truth for the format)."""
    return codec.encode(x)
