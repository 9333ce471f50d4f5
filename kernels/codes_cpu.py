"""codes_cpu: the compiled CPU kernel for attention on stored integer codes (codes_cpu.c), its launcher and checks.

    codes_supported(spec, head_dim, rows)     # True when the kernel takes this side for `rows` query rows
    float8_supported(dtype, head_dim, rows)   # the same for rows of 8-bit floats (an FP8 tier at scale 1)
    scores = codes_scores(q, codes, scale, spec, offset)   # (B, H, R, n) float32; spec: the side's QuantRows
    out = codes_weighted(w, codes, scale, spec, offset)    # (B, H, R, D) float32; offset: None or as the scale
    out = codes_decode(q, q_raw, keys, values, raw, out_map)   # a whole decode step, no mask
    codes_status()                            # "compiled C (AVX2, ...)", or why the torch path runs instead

It reads 2-, 3-, 4- and 8-bit integer codes and 2- to 4-bit Lloyd-Max codes, scaled per channel or per
token (turbo-4, turbo-3, rotated-4, int8, turbo-k4v2: every tier without a DCT), and rows of 8-bit floats
without a scale (fp8-e4m3, fp8-e5m2: pass the float8 tensor as the codes, scale and spec None). The torch reference is
decode_attention_torch's row path (rows() then a matmul): the same numbers up to float32 summation order
(tests/kernels/test_codes_cpu.py). On the CPU a decode step is memory-bound: the torch path writes and
reads 4 D bytes of float32 rows per token and side, this kernel reads the D b / 8 bytes of b-bit codes
and turns them into levels in registers.

The C files (SOURCES: codes_cpu.h says which holds what) are compiled together once per machine with
`-O3 -march=native -fopenmp` into the codeckv cache (kernels/c_build.py: a name holding a hash of the sources, the
flags and the CPU's feature flags); a compiler without OpenMP builds it without. codes_decode runs a step's
(batch, KV head) pairs on torch.get_num_threads() threads: the library links libgomp, which the loader resolves to
the one torch has loaded, so the pairs run on torch's own OpenMP threads (which spin between torch's ops) rather
than beside them. No compiler, a failed build or CODECKV_CPU_KERNEL=0: the torch path,
and codes_status() says why. Called with torch.inference_mode
or not alike; ctypes releases the GIL.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import torch

from codeckv.codecs.layout import QuantRows

from .c_build import compiled
from .layout import levels

SOURCE = Path(__file__).with_suffix(".c")  # the entry points; the header and the other files beside it
HEADER = SOURCE.with_suffix(".h")
SOURCES = (SOURCE, SOURCE.with_name("codes_loops_avx2.c"), SOURCE.with_name("codes_loops_portable.c"),
           SOURCE.with_name("codes_decode.c"))
OPENMP = "-fopenmp"  # codes_decode's (batch, head) pairs on torch's threads; a compiler without it builds without
FLAGS = ("-O3", "-march=native", "-std=c11", "-shared", "-fPIC", OPENMP)
MAX_ROWS = 64  # query rows per KV head the kernel takes (a decode step has G * T; a long prefill chunk uses torch)
MAX_DIM = 256
DISABLE_VARIABLE = "CODECKV_CPU_KERNEL"  # "0": never build or use the kernel


class _Call(ctypes.Structure):
    """CodesCall in codes_cpu.c: one call's tensors (data pointers), strides (elements) and sizes."""

    _fields_ = [
        (name, ctypes.c_void_p if name in ("rows", "codes", "scale", "offset", "level", "out") else ctypes.c_int64)
        for name in (
            "rows", "rows_b", "rows_h", "rows_r", "codes", "scale", "offset", "level",
            "codes_b", "codes_h", "codes_t", "scale_b", "scale_h", "scale_t",
            "bits", "group", "per_channel", "out", "batch", "heads", "nrows", "tokens", "dim", "float8",
        )
    ]


MAX_RAW = 4  # raw spans a whole decode step takes beside its coded one (codes_decode)


class _Decode(ctypes.Structure):
    """CodesDecode in codes_cpu.c: a whole decode step (one coded span, up to MAX_RAW raw ones)."""

    _fields_ = [
        ("keys", _Call), ("values", _Call), ("raw_q", ctypes.c_void_p), ("out_map", ctypes.c_void_p),
        ("n_raw", ctypes.c_int64), ("raw_k", ctypes.c_void_p * MAX_RAW), ("raw_v", ctypes.c_void_p * MAX_RAW),
        ("raw_tokens", ctypes.c_int64 * MAX_RAW), ("raw_b", ctypes.c_int64 * MAX_RAW),
        ("raw_h", ctypes.c_int64 * MAX_RAW), ("raw_t", ctypes.c_int64 * MAX_RAW),
        ("scores", ctypes.c_void_p), ("out", ctypes.c_void_p), ("threads", ctypes.c_int64),
    ]


def _library() -> tuple[ctypes.CDLL | None, str]:
    """(the loaded kernel, "compiled C (...)") or (None, "torch (why not)"): built at most once per process."""
    if os.environ.get(DISABLE_VARIABLE, "1") == "0":
        return None, f"torch ({DISABLE_VARIABLE}=0)"
    built = build(FLAGS)
    return built if built[0] is not None else build(tuple(f for f in FLAGS if f != OPENMP))


@functools.cache
def build(flags: tuple[str, ...]) -> tuple[ctypes.CDLL | None, str]:
    """Compile codes_cpu.c with `flags` into the cache (kernels/c_build.py) and load it.

    FLAGS is what the ops use; the tests also build with "-DCODES_PORTABLE" (the plain C loops).
    """
    lib, compiler = compiled("codes_cpu", (HEADER, *SOURCES), flags)
    if lib is None:
        return None, f"torch ({compiler})"
    for name, struct in (("codes_scores", _Call), ("codes_weighted", _Call), ("codes_decode", _Decode)):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(struct)]
    lib.codes_vectorized.restype = ctypes.c_int
    kind = "AVX2" if lib.codes_vectorized() else "portable C"
    shown = " ".join(f for f in flags if f.startswith("-march") or f == OPENMP)
    return lib, f"compiled C ({kind}, {compiler} {shown})"


def codes_status() -> str:
    """"compiled C (...)" when the kernel runs here, else "torch (why not)"."""
    return _library()[1]


BITS = (2, 3, 4, 8)  # integer codes the kernel reads; Lloyd-Max levels up to 4 bits
FLOAT8 = {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}  # 8-bit float rows it reads: FLOAT8_E4M3, FLOAT8_E5M2


def codes_supported(spec: QuantRows | None, head_dim: int, rows: int) -> bool:
    """True for codes the kernel reads (BITS; Lloyd-Max up to 4 bits; head_dim a multiple of 16, per-token
    groups of whole 8-channel chunks) with at most MAX_ROWS query rows per KV head, where it is built."""
    if spec is None or spec.bits not in BITS or (spec.lloyd_max and spec.bits > 4):
        return False
    if head_dim % 16 or head_dim > MAX_DIM or rows > MAX_ROWS or (not spec.per_channel and spec.group % 8):
        return False
    return _library()[0] is not None


def float8_supported(dtype: torch.dtype, head_dim: int, rows: int) -> bool:
    """True for rows of 8-bit floats (FLOAT8) the kernel reads unscaled, as codes_supported's other bounds."""
    if dtype not in FLOAT8 or head_dim % 16 or head_dim > MAX_DIM or rows > MAX_ROWS:
        return False
    return _library()[0] is not None


def _checked(codes: torch.Tensor, scale: torch.Tensor | None, offset: torch.Tensor | None, spec: QuantRows | None):
    if spec is None:  # rows of 8-bit floats, read as their bytes
        if codes.dtype not in FLOAT8 or scale is not None or offset is not None:
            raise ValueError(f"codes_cpu: rows without a spec must be 8-bit floats ({', '.join(map(str, FLOAT8))}) "
                             f"without scale or offset, not {codes.dtype}")
        if codes.device.type != "cpu":
            raise ValueError(f"codes_cpu: CPU tensors expected, not {codes.device}")
        codes = codes if codes.stride(-1) == 1 else codes.contiguous()
        return codes.view(torch.uint8), None, None, tuple(codes.shape)
    b, h, n, m = codes.shape
    d, group = m * 8 // spec.bits, spec.group
    want = (b, h, -(-n // group), d) if spec.per_channel else (b, h, n, d // group)
    stats = [scale] if offset is None else [scale, offset]
    if spec.bits not in BITS or codes.dtype != torch.uint8 or any(
            t.dtype != torch.float16 or tuple(t.shape) != want for t in stats):
        got = ", ".join(f"{tuple(t.shape)} {t.dtype}" for t in stats)
        raise ValueError(f"codes_cpu: {spec.bits}-bit codes {tuple(codes.shape)} {codes.dtype} with scale (and "
                         f"offset) {got}: expected {BITS}-bit uint8 codes and float16 scale (and offset) {want}")
    if codes.device.type != "cpu":
        raise ValueError(f"codes_cpu: CPU tensors expected, not {codes.device}")
    codes = codes if codes.stride(-1) == 1 else codes.contiguous()
    if offset is not None and (offset.stride() != scale.stride()):
        offset, scale = offset.contiguous(), scale.contiguous()
    scale = scale if scale.stride(-1) == 1 else scale.contiguous()
    return codes, scale, offset, (b, h, n, d)


def _side_call(rows_in: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor | None, offset: torch.Tensor | None,
               spec: QuantRows | None, out: torch.Tensor | None) -> tuple[_Call, tuple]:
    """The _Call of one side, and the tensors it points into (kept alive by the caller until the call returns);
    spec None: rows of 8-bit floats (FLOAT8), one group per row, no scale."""
    float8 = FLOAT8[codes.dtype] if spec is None and codes.dtype in FLOAT8 else 0
    codes, scale, offset, (b, h, n, d) = _checked(codes, scale, offset, spec)
    if rows_in.dtype != torch.float32 or rows_in.stride(-1) != 1:
        rows_in = rows_in.float().contiguous()
    bits, group, per_channel = (8, d, False) if spec is None else (spec.bits, spec.group, spec.per_channel)
    call = _Call(
        rows_in.data_ptr(), *rows_in.stride()[:3], codes.data_ptr(), None if scale is None else scale.data_ptr(),
        None if offset is None else offset.data_ptr(),
        levels(spec, "cpu").data_ptr() if spec is not None and spec.lloyd_max else None,
        *codes.stride()[:3], *((0, 0, 0) if scale is None else scale.stride()[:3]), bits, group, per_channel,
        None if out is None else out.data_ptr(), b, h, rows_in.shape[2], n, d, float8,
    )
    return call, (rows_in, codes, scale, offset)


def _kernel() -> ctypes.CDLL:
    lib = _library()[0]
    if lib is None:
        raise RuntimeError(f"codes_cpu: the kernel is not built here: {codes_status()}")
    return lib


def _call(name: str, rows_in: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor | None,
          offset: torch.Tensor | None, spec: QuantRows | None, last: str):
    lib = _kernel()
    b, h, n, m = codes.shape
    d = m if spec is None else m * 8 // spec.bits
    out = torch.empty(b, h, rows_in.shape[2], n if last == "tokens" else d, dtype=torch.float32)
    call, _alive = _side_call(rows_in, codes, scale, offset, spec, out)
    if getattr(lib, name)(ctypes.byref(call)) != 0:
        kind = f"{codes.dtype} rows" if spec is None else f"{spec.bits}-bit codes, group {spec.group}"
        raise ValueError(f"codes_cpu: {name} refused {kind}, head_dim {d}, {rows_in.shape[2]} rows "
                         "(see codes_supported, float8_supported)")
    return out


def codes_scores(q: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor | None, spec: QuantRows | None,
                 offset: torch.Tensor | None = None) -> torch.Tensor:
    """q (B, H, R, D) . (level[code] * scale + offset) of every token: (B, H, R, n) float32 (module docstring);
    spec None: codes are rows of 8-bit floats, scale and offset None."""
    return _call("codes_scores", q, codes, scale, offset, spec, "tokens")


def codes_weighted(w: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor | None, spec: QuantRows | None,
                   offset: torch.Tensor | None = None) -> torch.Tensor:
    """w (B, H, R, n) @ (level[code] * scale + offset): (B, H, R, D) float32 (module docstring); spec None as
    codes_scores'."""
    return _call("codes_weighted", w, codes, scale, offset, spec, "channels")


def codes_decode(q: torch.Tensor, q_raw: torch.Tensor, keys: tuple, values: tuple,
                 raw: list[tuple[torch.Tensor, torch.Tensor]], out_map: torch.Tensor | None) -> torch.Tensor:
    """A whole decode step's attention, no mask: softmax(q . [coded keys, raw keys]) @ [coded values, raw values].

    q (B, H, R, D): the scaled queries in the keys' rows' domain; q_raw: the same in the tokens' domain.
    keys, values: (codes, scale, offset or None, spec) of the coded span (8-bit float rows: (rows, None, None,
    None)); raw: up to MAX_RAW (keys, values)
    spans (B, H, n, D); out_map (D, D): value rows -> tokens' channels (a rotation's Q.T), or None.
    Returns (B, H, R, D) float32.
    """
    lib = _kernel()
    if len(raw) > MAX_RAW:
        raise ValueError(f"codes_cpu: codes_decode got {len(raw)} raw spans (allowed: at most {MAX_RAW})")
    q, q_raw = q.float().contiguous(), q_raw.float().contiguous()  # the two share their strides
    b, h, r, d = q.shape
    key_call, alive_k = _side_call(q, *keys, None)
    value_call, alive_v = _side_call(q, *values, None)
    spans = []
    for k, v in raw:
        k, v = k.float(), v.float()
        if k.stride() != v.stride() or k.stride(-1) != 1:
            k, v = k.contiguous(), v.contiguous()
        spans.append((k, v))
    coded = keys[0].shape[2]
    total = coded + sum(k.shape[2] for k, _ in spans)
    scores = torch.empty(b * h * r * total, dtype=torch.float32)  # each (batch, head)'s own
    out = torch.empty(b, h, r, d, dtype=torch.float32)
    out_map = None if out_map is None else out_map.float().contiguous()
    call = _Decode(key_call, value_call, q_raw.data_ptr(), None if out_map is None else out_map.data_ptr(), len(spans))
    for i, (k, v) in enumerate(spans):
        call.raw_k[i], call.raw_v[i], call.raw_tokens[i] = k.data_ptr(), v.data_ptr(), k.shape[2]
        call.raw_b[i], call.raw_h[i], call.raw_t[i] = k.stride(0), k.stride(1), k.stride(2)
    call.scores, call.out, call.threads = scores.data_ptr(), out.data_ptr(), torch.get_num_threads()
    if lib.codes_decode(ctypes.byref(call)) != 0:
        raise ValueError(f"codes_cpu: codes_decode refused head_dim {d}, {r} rows (see codes_supported)")
    return out
