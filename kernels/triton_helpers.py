"""Triton device helpers and launcher helpers shared by the kernels (the rows' format: kernels/layout.py).

Leaf quantizers share one dequantization rule, row = level[code] * scale (+ offset), with `scale` /
offset per token (D/group per row) or per channel (one per `group` rows), codes packed LSB-first
along head_dim (codecs/bitpack.py); the constexpr arguments `quant_meta` builds select the variant.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from codeckv.codecs.layout import QuantRows

from .layout import levels, scale_multiples, search_errors, thresholds


def row_strides(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, head, row) strides of a (B, H, N, ...) tensor whose last dim is contiguous."""
    if t.stride(-1) != 1:
        raise ValueError("the kernels need the last dimension of every stored tensor to be contiguous")
    return t.stride(0), t.stride(1), t.stride(2)


def pow2(n: int) -> int:
    """The smallest power of two >= n (and >= 1)."""
    return triton.next_power_of_2(max(int(n), 1))


FLOAT8 = {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2, torch.float8_e8m0fnu: 3}  # read as bytes: fp8_value


def float8_format(t: torch.Tensor | None) -> int:
    """The fp8_value format of a stored tensor: 1 e4m3, 2 e5m2, 3 e8m0; 0 for any other dtype (loaded as it is)."""
    return 0 if t is None else FLOAT8.get(t.dtype, 0)


def loadable(t: torch.Tensor) -> torch.Tensor:
    """A stored tensor as a kernel takes it: an 8-bit float one as its bytes (no GPU before sm_89 loads fp8, and
    Triton has no e8m0 type), decoded in the kernel by fp8_value; anything else as it is."""
    return t.view(torch.uint8) if t.dtype in FLOAT8 else t


def quant_meta(spec: QuantRows | None, prefix: str, rows: torch.Tensor | None = None,
               scale: torch.Tensor | None = None) -> dict[str, int | bool]:
    """Constexpr kernel arguments of a row stream: {prefix}RAW, BITS, GROUP, PER_CHANNEL, HAS_OFFSET, LLOYD, and
    RAW_FMT / SCALE_FMT, the 8-bit float formats of its raw rows / scales (float8_format of the stored tensors)."""
    formats = {f"{prefix}RAW_FMT": float8_format(rows) if spec is None else 0,
               f"{prefix}SCALE_FMT": float8_format(scale) if spec is not None else 0}
    if spec is None:
        return {f"{prefix}RAW": True, f"{prefix}BITS": 8, f"{prefix}GROUP": 1, f"{prefix}PER_CHANNEL": False,
                f"{prefix}HAS_OFFSET": False, f"{prefix}LLOYD": False, **formats}
    return {f"{prefix}RAW": False, f"{prefix}BITS": spec.bits, f"{prefix}GROUP": spec.group,
            f"{prefix}PER_CHANNEL": spec.per_channel, f"{prefix}HAS_OFFSET": spec.offset is not None,
            f"{prefix}LLOYD": spec.lloyd_max, **formats}


# ----------------------------------------------------------------------------------------------------------------
# Triton device helpers


@triton.jit
def unpack_codes(codes_ptr, rows, chans, mask, row_stride, BITS: tl.constexpr):
    """Integer codes at (rows, chans) of LSB-first packed rows (codecs/bitpack.py); int32, broadcast shape."""
    if BITS == 8:  # one code per byte: contiguous loads
        code = tl.load(codes_ptr + rows * row_stride + chans, mask=mask, other=0).to(tl.int32)
    else:
        bit = chans * BITS
        byte_ptr = codes_ptr + rows * row_stride + bit // 8
        shift = bit % 8
        word = tl.load(byte_ptr, mask=mask, other=0).to(tl.int32)
        if BITS == 3:  # a 3-bit code may straddle two bytes (shift 6 or 7)
            word = word | (tl.load(byte_ptr + 1, mask=mask & (shift > 5), other=0).to(tl.int32) << 8)
        code = (word >> shift) & ((1 << BITS) - 1)
    return code


@triton.jit
def fp8_value(byte, FMT: tl.constexpr):
    """float32 of 8-bit float bytes (int32, 0..255): FMT 1 e4m3 (bias 7), 2 e5m2 (bias 15), 3 e8m0 (2^(byte-127))."""
    if FMT == 3:
        return tl.math.exp2((byte - 127).to(tl.float32))
    M_BITS: tl.constexpr = 3 if FMT == 1 else 2
    E_MASK: tl.constexpr = 15 if FMT == 1 else 31
    BIAS: tl.constexpr = 7 if FMT == 1 else 15
    e = (byte >> M_BITS) & E_MASK
    m = (byte & ((1 << M_BITS) - 1)).to(tl.float32) * (1.0 / (1 << M_BITS))
    magnitude = tl.where(e == 0, m * tl.math.exp2(1.0 - BIAS), (1.0 + m) * tl.math.exp2((e - BIAS).to(tl.float32)))
    return tl.where((byte & 128) != 0, -magnitude, magnitude)


@triton.jit
def load_rows(
    rows_ptr,  # codes (B, H, N, D*bits/8) uint8, or raw rows (B, H, N, D), already offset to (b, h)
    scale_ptr,  # fp16 (or 8-bit float) scales, offset to (b, h): (N, D/group) per token, (N/group, D) per channel
    offset_ptr,  # fp16 zeros, same layout as scale (ignored unless HAS_OFFSET)
    lut_ptr,  # (2**bits,) float32 levels (Lloyd-Max codebook; ignored unless LLOYD)
    rows, chans, mask,  # broadcastable row / channel indices and validity
    row_stride, stat_stride,  # element strides between rows of rows_ptr / scale_ptr
    RAW: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr, PER_CHANNEL: tl.constexpr,
    HAS_OFFSET: tl.constexpr, LLOYD: tl.constexpr,
    RAW_FMT: tl.constexpr, SCALE_FMT: tl.constexpr,  # 0, or the fp8_value format of raw rows / scales held as bytes
):
    """Dequantized float32 rows: level[code] * scale (+ offset), or the raw rows cast to float32."""
    if RAW:
        if RAW_FMT == 0:
            x = tl.load(rows_ptr + rows * row_stride + chans, mask=mask, other=0.0).to(tl.float32)
        else:
            x = fp8_value(tl.load(rows_ptr + rows * row_stride + chans, mask=mask, other=0).to(tl.int32), RAW_FMT)
    else:
        code = unpack_codes(rows_ptr, rows, chans, mask, row_stride, BITS)
        if LLOYD:
            level = tl.load(lut_ptr + code, mask=mask, other=0.0)
        else:
            level = code.to(tl.float32)
        if PER_CHANNEL:
            stat = (rows // GROUP) * stat_stride + chans
        else:
            stat = rows * stat_stride + chans // GROUP
        if SCALE_FMT == 0:
            x = level * tl.load(scale_ptr + stat, mask=mask, other=0.0).to(tl.float32)
        else:
            x = level * fp8_value(tl.load(scale_ptr + stat, mask=mask, other=0).to(tl.int32), SCALE_FMT)
        if HAS_OFFSET:
            x = x + tl.load(offset_ptr + stat, mask=mask, other=0.0).to(tl.float32)
    return x


@triton.jit
def round_half_even(x):
    """torch.round for float32: to the nearest integer, ties to even."""
    f = tl.floor(x)
    d = x - f
    odd = f - 2.0 * tl.floor(f * 0.5)
    return tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, f + odd))


@triton.jit
def pack_codes(
    code,  # (R_P, NG_P, GW_P) int32 codes; element (row, g, t) is channel g*GW + t
    mask,  # (R_P, NG_P, GW_P) validity
    rows,  # (R_P, 1, 1) row index within the (b, h) stream
    gidx,  # (1, NG_P, 1) group index along head_dim
    codes_ptr,  # (N, D*bits/8) uint8 output, already offset to (b, h)
    code_stride,  # bytes between rows
    GW: tl.constexpr, BITS: tl.constexpr,
):
    """Store codes LSB-first packed (codecs/bitpack.py): `unit` codes -> `unit*bits/8` bytes; GW % unit == 0."""
    UNIT: tl.constexpr = 8 if BITS == 3 else 8 // BITS
    UNIT_BYTES: tl.constexpr = UNIT * BITS // 8
    R_P: tl.constexpr = code.shape[0]
    NG_P: tl.constexpr = code.shape[1]
    NU_P: tl.constexpr = code.shape[2] // UNIT
    units = tl.reshape(code, (R_P, NG_P, NU_P, UNIT))
    shifts = (tl.arange(0, UNIT) * BITS)[None, None, None, :]
    word = tl.sum(units << shifts, axis=3)  # (R_P, NG_P, NU_P): at most 24 bits
    ok = tl.max(tl.reshape(mask.to(tl.int32), (R_P, NG_P, NU_P, UNIT)), axis=3) > 0
    uidx = tl.arange(0, NU_P)[None, None, :]
    dst = codes_ptr + rows * code_stride + gidx * (GW * BITS // 8) + uidx * UNIT_BYTES
    for p in tl.static_range(UNIT_BYTES):
        tl.store(dst + p, ((word >> (8 * p)) & 255).to(tl.uint8), mask=ok)


@triton.jit
def nearest_code(u, thr_ptr, BITS: tl.constexpr):
    """Index of the nearest Lloyd-Max level of u: how many thresholds are < u (torch.bucketize), binary search."""
    c = tl.zeros(u.shape, tl.int32)
    for step in tl.static_range(BITS):
        probe = c + (1 << (BITS - 1 - step))
        c = tl.where(u > tl.load(thr_ptr + probe - 1), probe, c)
    return c


@triton.jit
def quantize_pack(
    y,  # (R_P, NG_P, GW_P) float32 values; element (row, g, t) is channel g*GW + t
    mask,  # (R_P, NG_P, GW_P) validity
    rows,  # (R_P, 1, 1) row index within the (b, h) stream
    gidx,  # (1, NG_P, 1) group index along head_dim (0 per channel)
    tidx,  # (1, 1, GW_P) index within the group (the channel, per channel)
    stat_row,  # per channel: the index of the quantization group these rows form (the tile is one group)
    codes_ptr, scale_ptr, offset_ptr,  # outputs, already offset to (b, h); offset = GroupQuant's zero
    lut_ptr,  # (2**bits,) float32 Lloyd-Max levels
    thr_ptr,  # (2**bits - 1,) float32 Lloyd-Max decision thresholds
    mult_ptr, n_mult,  # candidate multiples of the group RMS (LloydMaxQuant.scales), float32
    err_ptr, n_bins,  # (n_bins, n_mult) float32 search table ERRORS (codecs/lloyd_search.py)
    code_stride, stat_stride,  # element strides between rows of codes / of scale
    GW: tl.constexpr,  # channels per group (per token), head_dim (per channel)
    BITS: tl.constexpr, PER_CHANNEL: tl.constexpr, LLOYD: tl.constexpr,
    BIN_SCALE: tl.constexpr, REFIT: tl.constexpr,  # 2**search_shift; least-squares refit (Lloyd-Max only)
):
    """Quantize one tile exactly as GroupQuant / LloydMaxQuant.encode do; store codes, scales and offsets."""
    AXIS: tl.constexpr = 0 if PER_CHANNEL else 2  # the axis one quantization group spans
    LEVELS: tl.constexpr = (1 << BITS) - 1
    TINY: tl.constexpr = 1.1754943508222875e-38  # 2**-126, codecs/lloyd_search.py
    count = tl.maximum(tl.sum(mask.to(tl.float32), axis=AXIS, keep_dims=True), 1.0)
    stat_mask = tl.max(mask.to(tl.int32), axis=AXIS, keep_dims=True) > 0
    if PER_CHANNEL:
        stat_off = stat_row * stat_stride + gidx * GW + tidx  # (1, NG_P, GW_P)
    else:
        stat_off = rows * stat_stride + gidx  # (R_P, NG_P, 1)
    if LLOYD:  # the search of codecs/lloyd_search.py, step by step
        y64 = y.to(tl.float64)
        sum_sq = tl.sum(tl.where(mask, y64 * y64, 0.0), axis=AXIS, keep_dims=True)
        rms = tl.sqrt_rn((sum_sq / count.to(tl.float64)).to(tl.float32))
        v = tl.abs(tl.math.div_rn(y, tl.maximum(rms, TINY)))
        bins = tl.minimum(tl.maximum(tl.minimum(v * BIN_SCALE, n_bins - 0.5).to(tl.int32), 0), n_bins - 1)
        best_err = tl.full(rms.shape, float("inf"), tl.float32)
        best_mult = tl.zeros(rms.shape, tl.float32)
        for i in range(n_mult):  # predicted error of every candidate: integer-valued float32 sums, exact
            err = tl.sum(tl.where(mask, tl.load(err_ptr + bins * n_mult + i, mask=mask, other=0.0), 0.0),
                         axis=AXIS, keep_dims=True)
            better = err < best_err
            best_mult = tl.where(better, tl.load(mult_ptr + i), best_mult)
            best_err = tl.where(better, err, best_err)
        s = (rms * best_mult).to(tl.float16).to(tl.float32)
        code = nearest_code(tl.math.div_rn(y, tl.maximum(s, TINY)), thr_ptr, BITS)
        if REFIT:  # least squares on the chosen levels, sums in float64
            lv = tl.load(lut_ptr + code).to(tl.float64)
            num = tl.sum(tl.where(mask, y64 * lv, 0.0), axis=AXIS, keep_dims=True).to(tl.float32)
            den = tl.sum(tl.where(mask, lv * lv, 0.0), axis=AXIS, keep_dims=True).to(tl.float32)
            s = tl.math.div_rn(num, tl.maximum(den, TINY)).to(tl.float16).to(tl.float32)
            code = nearest_code(tl.math.div_rn(y, tl.maximum(s, TINY)), thr_ptr, BITS)
        tl.store(scale_ptr + stat_off, s.to(tl.float16), mask=stat_mask)
    else:
        lo = tl.min(tl.where(mask, y, float("inf")), axis=AXIS, keep_dims=True)
        hi = tl.max(tl.where(mask, y, float("-inf")), axis=AXIS, keep_dims=True)
        zero = lo.to(tl.float16)
        z = zero.to(tl.float32)
        scale = tl.math.div_rn(hi - z, tl.full(hi.shape, LEVELS, tl.float32)).to(tl.float16)
        s = scale.to(tl.float32)
        tl.store(scale_ptr + stat_off, scale, mask=stat_mask)
        tl.store(offset_ptr + stat_off, zero, mask=stat_mask)
        q = tl.where(s > 0, tl.math.div_rn(y - z, tl.where(s > 0, s, 1.0)), 0.0)
        code = tl.minimum(tl.maximum(round_half_even(q), 0.0), LEVELS * 1.0).to(tl.int32)
    pack_codes(code, mask, rows, gidx, codes_ptr, code_stride, GW, BITS)


@triton.jit
def rotation_slab(q_ptr, c0, SLAB: tl.constexpr, D: tl.constexpr, TRANSPOSE: tl.constexpr):
    """Rows [c0, c0 + SLAB) of Q (or of Q.T): (SLAB, D) float32; Q (D, D) row-major, D a power of two.

    y @ Q is accumulated slab by slab, sum over c0 of y[:, c0:c0+SLAB] @ slab, so that neither the
    whole of Q nor a whole tile of y has to sit in registers next to the product.
    """
    i = c0 + tl.arange(0, SLAB)[:, None]
    j = tl.arange(0, D)[None, :]
    if TRANSPOSE:
        q = tl.load(q_ptr + j * D + i)
    else:
        q = tl.load(q_ptr + i * D + j)
    return q


def rotation_slab_width(head_dim: int) -> int:
    """Channels per rotation slab (a power of two >= 16 dividing head_dim, as tl.dot needs)."""
    return min(32, head_dim)


# ----------------------------------------------------------------------------------------------------------------
# Launcher helpers


@dataclass(frozen=True)
class Launch:
    """One kernel launch, `kernel[grid](*args, **kwargs)`, described before it runs.

    Each launcher builds its launches with a `*_launches` function and then runs them; kernels/compile_check.py
    compiles the same descriptions for a GPU it does not have, so both see the same signature and constexprs.
    """

    kernel: triton.JITFunction  # an InterpretedFunction under TRITON_INTERPRET=1
    grid: tuple[int, ...]
    args: tuple
    kwargs: dict = field(default_factory=dict)  # constexprs and launch options (num_warps)

    def __call__(self):
        """Run it; returns Triton's compiled kernel on a GPU (its registers and spills as the driver loaded it)."""
        return self.kernel[self.grid](*self.args, **self.kwargs)



def quant_outputs(spec: QuantRows, shape: tuple[int, int, int, int], device: torch.device, prefix: str = ""):
    """Empty (codes, scale, offset) for `shape` = (B, H, N, D) rows, and the Encoded.data dict holding them."""
    b, h, n, d = shape
    codes = torch.empty((b, h, n, d * spec.bits // 8), dtype=torch.uint8, device=device)
    stat_shape = (b, h, n // spec.group, d) if spec.per_channel else (b, h, n, d // spec.group)
    scale = torch.empty(stat_shape, dtype=torch.float16, device=device)
    offset = torch.empty(stat_shape, dtype=torch.float16, device=device) if spec.offset else None
    data = {prefix + spec.codes: codes, prefix + spec.scale: scale}
    if offset is not None:
        data[prefix + spec.offset] = offset
    return codes, scale, offset, data


def encoder_writes(spec: QuantRows | None) -> bool:
    """True for rows quantize_pack writes: a min/max grid, or Lloyd-Max levels with their search tables. Other
    codebooks (FP4's E2M1, scaled by its own rule) and rows whose codec chooses its codes itself (vLLM's TurboQuant
    values) are encoded by their codec."""
    if spec is not None and spec.codec_encodes:
        return False
    return spec is None or not spec.lloyd_max or (spec.thresholds is not None and bool(spec.scale_multiples))


def encoder_inputs(spec: QuantRows | None, device: torch.device) -> list:
    """quantize_pack's table arguments: levels, thresholds, multiples, their count, the search table, its bins.

    Float32 tensors for a Lloyd-Max encoder; dummies otherwise. encoder_meta(spec) gives the constexprs.
    """
    if spec is None or not spec.lloyd_max:
        dummy = torch.zeros(1, dtype=torch.float32, device=device)
        return [dummy, dummy, dummy, 1, dummy, 1]
    mults = scale_multiples(spec, device)
    return [levels(spec, device), thresholds(spec, device), mults, mults.numel(), search_errors(spec, device),
            spec.search_bins]


def encoder_meta(spec: QuantRows | None) -> dict[str, float | bool]:
    """quantize_pack's search constexprs: BIN_SCALE = 2**search_shift, REFIT."""
    lloyd = spec is not None and spec.lloyd_max
    return {"BIN_SCALE": float(2 ** spec.search_shift) if lloyd else 1.0, "REFIT": bool(lloyd and spec.refit)}


def tile_layout(spec: QuantRows | None, head_dim: int) -> dict[str, int]:
    """Channel tiling of a row: NG groups of GW channels (per token), or one group of D (per channel / raw)."""
    width = spec.group if spec is not None and not spec.per_channel else head_dim
    groups = head_dim // width
    return {"NG": groups, "NG_P": pow2(groups), "GW": width, "GW_P": pow2(width)}
