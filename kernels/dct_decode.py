"""dct_decode: dequantize stored DCT coefficients and run the inverse block DCT, in one pass.

Reads exactly what `codecs.DCT.encode` stores (raw `coeffs`, a Cast's `coeffs.values`, or a
GroupQuant / LloydMaxQuant / Rotation(...) quantizer's `coeffs.*` tensors) and writes the
(B, H, S, D) tokens `DCT.decode` returns. One program reconstructs BLOCK_NB whole blocks: token n of block b is
sum_j M[j, n] * coeff[b*k + j] (then @ Q.T for a rotated quantizer), the dequantized coefficients
living only in registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from codeckv.codecs.layout import Codec, Encoded, RowLayout

from .layout import basis, layout_of, levels, rotation, tensors
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

TOKENS_PER_TILE = 32  # about this many output tokens per program


@triton.jit
def _dct_decode_kernel(
    rows_ptr,  # quantized: (B, H, NROWS, D*bits/8) uint8 codes | raw: (B, H, NROWS, D) coefficients, any float
    scale_ptr, offset_ptr,  # fp16 scales / zeros of the quantizer (quantized only)
    lut_ptr,  # (2**bits,) float32 Lloyd-Max levels (LLOYD only)
    basis_ptr,  # (K, R) float32 DCT-II basis M
    rot_ptr,  # (D, D) float32 rotation Q (ROTATE only)
    out_ptr,  # (B, H, S, D) decoded tokens, contiguous, in the original dtype
    n_heads, n_blocks,  # H, nb = S / R
    r_sb, r_sh, r_sr,  # rows / codes strides (batch, head, row)
    s_sb, s_sh, s_sr,  # scale / offset strides (batch, head, row)
    K: tl.constexpr, R: tl.constexpr, R_P: tl.constexpr, BLOCK_NB: tl.constexpr,  # frequencies, block, tile
    D: tl.constexpr, D_P: tl.constexpr, ROTATE: tl.constexpr, SLAB: tl.constexpr,
    RAW: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, PER_CHANNEL: tl.constexpr,
    HAS_OFFSET: tl.constexpr, LLOYD: tl.constexpr, RAW_FMT: tl.constexpr, SCALE_FMT: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_t = tl.program_id(1)
    b = (pid_bh // n_heads).to(tl.int64)
    h = (pid_bh % n_heads).to(tl.int64)
    blk = pid_t * BLOCK_NB + tl.arange(0, BLOCK_NB)[:, None, None]  # (NB, 1, 1)
    n = tl.arange(0, R_P)[None, :, None]  # (1, R_P, 1) token within the block
    d = tl.arange(0, D_P)[None, None, :]  # (1, 1, D_P)
    row_mask = (blk < n_blocks) & (d < D)
    rows_base = rows_ptr + b * r_sb + h * r_sh
    scale_base = scale_ptr + b * s_sb + h * s_sh
    offset_base = offset_ptr + b * s_sb + h * s_sh
    if ROTATE:  # synthesize SLAB channels at a time, each slab then rotated back: out += part @ Q.T[slab]
        out2 = tl.zeros((BLOCK_NB * R_P, D_P), dtype=tl.float32)
        for c0 in tl.static_range(0, D, SLAB):
            dc = c0 + tl.arange(0, SLAB)[None, None, :]
            part = tl.zeros((BLOCK_NB, R_P, SLAB), dtype=tl.float32)
            for j in range(K):
                coeff = load_rows(rows_base, scale_base, offset_base, lut_ptr, blk * K + j, dc, blk < n_blocks,
                                  r_sr, s_sr, RAW, BITS, GROUP, PER_CHANNEL, HAS_OFFSET, LLOYD, RAW_FMT,
                                  SCALE_FMT)  # (NB, 1, SLAB)
                part += tl.load(basis_ptr + j * R + n, mask=n < R, other=0.0) * coeff
            out2 += tl.dot(tl.reshape(part, (BLOCK_NB * R_P, SLAB)), rotation_slab(rot_ptr, c0, SLAB, D, True),
                           input_precision="ieee")
        out = tl.reshape(out2, (BLOCK_NB, R_P, D_P))
    else:
        out = tl.zeros((BLOCK_NB, R_P, D_P), dtype=tl.float32)
        for j in range(K):  # x[blk*R + n] = sum_j M[j, n] * coeff[blk*K + j]
            coeff = load_rows(rows_base, scale_base, offset_base, lut_ptr, blk * K + j, d, row_mask, r_sr, s_sr,
                              RAW, BITS, GROUP, PER_CHANNEL, HAS_OFFSET, LLOYD, RAW_FMT, SCALE_FMT)  # (NB, 1, D_P)
            m = tl.load(basis_ptr + j * R + n, mask=n < R, other=0.0)  # (1, R_P, 1)
            out += m * coeff
    dst = out_ptr + (b * n_heads + h) * n_blocks * R * D + (blk * R + n) * D + d
    tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=row_mask & (n < R))


def dct_decode_supported(enc: Encoded, codec: Codec) -> bool:
    """True when the Triton kernel can decode this archive: a DCT layout (block > 1) it reads."""
    layout = layout_of(codec)
    d = enc.shape[-1]
    if not isinstance(layout, RowLayout) or layout.block == 1:
        return False
    return layout.rotation is None or (d >= 16 and d & (d - 1) == 0)


def dct_decode_launch(enc: Encoded, codec: Codec) -> tuple[Launch, torch.Tensor]:
    """The launch that decodes an archive of `codec`, and the (B, H, S, D) output it fills."""
    if not dct_decode_supported(enc, codec):
        raise ValueError(f"dct_decode_triton: {codec!r} with head_dim {enc.shape[-1]} is not supported")
    b, h, s, d = enc.shape
    layout = layout_of(codec)
    rows, scale, offset = tensors(layout, enc)
    device = rows.device
    spec = layout.quant
    m = basis(layout, device)
    rot = rotation(layout, d, device)
    lut = levels(spec, device) if spec is not None else m
    out = torch.empty((b, h, s, d), dtype=enc.dtype, device=device)
    n_blocks = s // layout.block
    r_p = pow2(layout.block)
    if rot is None:
        block_nb = pow2(max(1, TOKENS_PER_TILE // r_p))
    else:
        block_nb = pow2(triton.cdiv(16, r_p))  # 16 tokens: tl.dot's minimum, and the rotation's registers
    meta = quant_meta(spec, "", rows, scale)
    scale = rows if scale is None else scale
    launch = Launch(_dct_decode_kernel, (b * h, triton.cdiv(n_blocks, block_nb)), (
        loadable(rows), loadable(scale), loadable(scale if offset is None else offset), lut, m,
        m if rot is None else rot, out,
        h, n_blocks, *row_strides(rows), *row_strides(scale),
    ), dict(
        K=layout.k, R=layout.block, R_P=r_p, BLOCK_NB=block_nb, D=d, D_P=pow2(d), ROTATE=rot is not None,
        SLAB=rotation_slab_width(d),
        num_warps=8 if rot is not None else 4,
        **meta,
    ))
    return launch, out


def dct_decode_triton(enc: Encoded, codec: Codec) -> torch.Tensor:
    """Decode an archive of `codec` with the Triton kernel: the same (B, H, S, D) as codec.decode(enc)."""
    launch, out = dct_decode_launch(enc, codec)
    launch()
    return out


def dct_decode_ref(enc: Encoded, codec: Codec) -> torch.Tensor:
    """The torch reference: the codec's own decode (the single source of truth for the format)."""
    return codec.decode(enc)
