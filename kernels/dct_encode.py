"""dct_encode: block DCT-II along the sequence with the coefficient quantization fused, in one pass.

Writes exactly the tensors `codecs.DCT.encode` stores (codecs/dct.py): `coeffs` (B, H, nb*k, D) in
x.dtype when the DCT has no inner codec, `coeffs.values` in its dtype for a Cast, else the quantizer's
`coeffs.codes` / `coeffs.scale` / `coeffs.zero` (GroupQuant), codes bit-packed LSB-first. One
program computes a tile of coefficient rows (row = block * k + frequency) straight from the tokens,
optionally rotates them (DCT over Rotation), quantizes and packs them; the float coefficients never
reach memory.

Tiles: per-token groups -> ROWS = 16 coefficient rows per program; per-channel groups (KIVI style)
-> one quantization group of `group` rows per program, reduced along the rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from codeckv.codecs.layout import Codec, Encoded, RowLayout, check_input

from .layout import basis, layout_of, raw_dtype, rotation
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

ROWS_PER_TOKEN_TILE = 16  # coefficient rows per program with per-token groups


@triton.jit
def _dct_encode_kernel(
    x_ptr,  # (B, H, S, D) tokens, any float dtype
    basis_ptr,  # (K, R) float32 DCT-II basis M
    out_ptr,  # raw: (B, H, NROWS, D) coefficients (x.dtype or Cast's) | quantized: (B, H, NROWS, D*bits/8) uint8
    scale_ptr, offset_ptr,  # fp16 scales and zeros (quantized only; zeros only for GroupQuant)
    lut_ptr, thr_ptr, mult_ptr, n_mult, err_ptr, n_bins,  # Lloyd-Max tables (LLOYD only; encoder_inputs)
    rot_ptr,  # (D, D) float32 rotation Q (ROTATE only)
    n_heads, n_rows,  # H, NROWS = nb * K
    x_sb, x_sh, x_ss,  # x strides (batch, head, token)
    o_sb, o_sh, o_sr,  # out strides (batch, head, row)
    s_sb, s_sh, s_sr,  # scale / offset strides (batch, head, row)
    K: tl.constexpr, R: tl.constexpr,  # frequencies kept, block size
    ROWS: tl.constexpr, R_P: tl.constexpr,  # coefficient rows per program, padded to a power of two
    D: tl.constexpr, NG: tl.constexpr, NG_P: tl.constexpr, GW: tl.constexpr, GW_P: tl.constexpr,  # channel tiling
    QUANT: tl.constexpr, BITS: tl.constexpr, PER_CHANNEL: tl.constexpr, LLOYD: tl.constexpr,
    ROTATE: tl.constexpr, SLAB: tl.constexpr,
    BIN_SCALE: tl.constexpr, REFIT: tl.constexpr,  # Lloyd-Max search (encoder_meta)
):
    pid_bh = tl.program_id(0)
    pid_t = tl.program_id(1)
    b = (pid_bh // n_heads).to(tl.int64)
    h = (pid_bh % n_heads).to(tl.int64)
    ri = tl.arange(0, R_P)[:, None, None]
    rows = pid_t * ROWS + ri  # (R_P, 1, 1) coefficient rows
    gidx = tl.arange(0, NG_P)[None, :, None]
    tidx = tl.arange(0, GW_P)[None, None, :]
    chans = gidx * GW + tidx  # (1, NG_P, GW_P)
    row_ok = (ri < ROWS) & (rows < n_rows)
    mask = row_ok & (gidx < NG) & (tidx < GW)
    block = rows // K
    freq = rows % K
    x_base = x_ptr + b * x_sb + h * x_sh
    if ROTATE:  # SLAB channels of coefficients at a time, each slab then rotated: acc += part @ Q[slab]
        rows2 = pid_t * ROWS + tl.arange(0, R_P)[:, None]
        ok2 = (tl.arange(0, R_P)[:, None] < ROWS) & (rows2 < n_rows)
        acc2 = tl.zeros((R_P, D), dtype=tl.float32)
        for c0 in tl.static_range(0, D, SLAB):
            part = tl.zeros((R_P, SLAB), dtype=tl.float32)
            for n in range(R):
                m = tl.load(basis_ptr + (rows2 % K) * R + n, mask=ok2, other=0.0)
                src = x_base + ((rows2 // K) * R + n) * x_ss + c0 + tl.arange(0, SLAB)[None, :]
                part += m * tl.load(src, mask=ok2, other=0.0).to(tl.float32)
            acc2 += tl.dot(part, rotation_slab(rot_ptr, c0, SLAB, D, False), input_precision="ieee")
        acc = tl.reshape(acc2, (R_P, NG_P, GW_P))
    else:
        acc = tl.zeros((R_P, NG_P, GW_P), dtype=tl.float32)
        for n in range(R):  # coeffs[row] = sum_n M[freq, n] * x[block * R + n]
            m = tl.load(basis_ptr + freq * R + n, mask=row_ok, other=0.0)
            xv = tl.load(x_base + (block * R + n) * x_ss + chans, mask=mask, other=0.0).to(tl.float32)
            acc += m * xv
    if QUANT:
        quantize_pack(
            acc, mask, rows, gidx, tidx, pid_t,
            out_ptr + b * o_sb + h * o_sh, scale_ptr + b * s_sb + h * s_sh, offset_ptr + b * s_sb + h * s_sh,
            lut_ptr, thr_ptr, mult_ptr, n_mult, err_ptr, n_bins, o_sr, s_sr,
            GW, BITS, PER_CHANNEL, LLOYD, BIN_SCALE, REFIT,
        )
    else:
        dst = out_ptr + b * o_sb + h * o_sh + rows * o_sr + chans
        tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=mask)


def dct_encode_supported(x: torch.Tensor, codec: Codec) -> bool:
    """True when the Triton kernel can encode x with this codec: a DCT layout (block > 1) whose rows it writes."""
    layout = layout_of(codec)
    d = x.shape[-1]
    if not isinstance(layout, RowLayout) or layout.block == 1:
        return False
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    spec = layout.quant
    if spec is not None and not (spec.packs(d) and spec.fits(d) and encoder_writes(spec)):
        return False
    return layout.rotation is None or (d >= 16 and d & (d - 1) == 0)


def dct_encode_launch(x: torch.Tensor, codec: Codec) -> tuple[Launch, Encoded]:
    """The launch that encodes x (B, H, S, D), and the Encoded of the outputs it fills."""
    check_input(x, codec.block_tokens, "dct_encode")
    if not dct_encode_supported(x, codec):
        raise ValueError(f"dct_encode_triton: {codec!r} on {x.dtype} head_dim {x.shape[-1]} is not supported")
    x = x if x.stride(-1) == 1 else x.contiguous()
    b, h, s, d = x.shape
    layout = layout_of(codec)
    spec = layout.quant
    n_rows = s // layout.block * layout.k
    m = basis(layout, x.device)
    tiles = tile_layout(spec, d)
    if spec is None:
        out = torch.empty((b, h, n_rows, d), dtype=raw_dtype(layout, x.dtype), device=x.device)
        scale = offset = out
        data = {layout.name(layout.rows.name): out}
        rows = ROWS_PER_TOKEN_TILE
    else:
        out, scale, offset, data = quant_outputs(spec, (b, h, n_rows, d), x.device, layout.prefix)
        offset = scale if offset is None else offset
        rows = spec.group if spec.per_channel else ROWS_PER_TOKEN_TILE
    rot = rotation(layout, d, x.device)
    launch = Launch(_dct_encode_kernel, (b * h, triton.cdiv(n_rows, rows)), (
        x, m, out, scale, offset, *encoder_inputs(spec, x.device),
        m if rot is None else rot,
        h, n_rows,
        x.stride(0), x.stride(1), x.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        scale.stride(0), scale.stride(1), scale.stride(2),
    ), dict(
        K=layout.k, R=layout.block, ROWS=rows, R_P=max(pow2(rows), 16 if rot is not None else 1),
        D=d, **tiles,
        QUANT=spec is not None, BITS=spec.bits if spec else 8, PER_CHANNEL=bool(spec and spec.per_channel),
        LLOYD=bool(spec and spec.lloyd_max), ROTATE=rot is not None, SLAB=rotation_slab_width(d),
        **encoder_meta(spec), num_warps=8 if rot is not None else 4,
    ))
    return launch, Encoded(data, (b, h, s, d), x.dtype)


def dct_encode_triton(x: torch.Tensor, codec: Codec) -> Encoded:
    """Encode x (B, H, S, D) with the Triton kernel: the same Encoded as codec.encode(x)."""
    launch, enc = dct_encode_launch(x, codec)
    launch()
    return enc


def dct_encode_ref(x: torch.Tensor, codec: Codec) -> Encoded:
    """The torch reference: the codec's own encode (the single source of truth for the format)."""
    return codec.encode(x)
