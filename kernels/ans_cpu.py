"""ans_cpu: the PCA tiers' rANS encoder and rate-control cost pass, compiled (ans_cpu.c), and their launchers.

    ans_available()                                   # True where the library is built (else: the reference)
    streams = ans_encode(codes, order, classes, shift, offset, low, frequency)   # one bytes per row of codes
    per_row = ans_costs(y, steps, shift, classes, costs, limit)                  # (S,) int64 summed costs
    ans_status()                                      # "compiled C (cc -march=native)", or why not

The references are codeckv's: ans_encode writes byte for byte what codecs/ans_vectorized.py's numpy coder
(and constriction) write for the same codes; ans_costs sums exactly what codecs/pca.py's stream_bytes sums
in torch (integer costs: the same totals on any CPU and thread count). tests/kernels/test_ans_cpu.py checks
both. Why compiled: numpy runs the coder one step per symbol across streams (a dozen array passes a
step) and torch the cost pass as six passes over the components; a 4k-token Qwen context's conversion to
pca-5x spent about two thirds of its time there.

Built like codes_cpu.c (kernels/c_build.py: once per machine, `-O3 -march=native`, a hash-named library in
the codeckv cache); no compiler, a failed build or CODECKV_CPU_KERNEL=0: ans_available() is False and the
callers run the references. Single-threaded: split across two Python threads, a 4k conversion on two cores
took 1.7-2.2 s instead of 1.2 s (torch's own threads, waiting between its ops, hold the cores); ctypes
releases the GIL.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import numpy as np
import torch

from .c_build import compiled
from .codes_cpu import DISABLE_VARIABLE

SOURCE = Path(__file__).with_suffix(".c")
FLAGS = ("-O3", "-march=native", "-std=c11", "-shared", "-fPIC")
_P = ctypes.c_void_p
_I = ctypes.c_int64


class _Encode(ctypes.Structure):
    """AnsEncode in ans_cpu.c."""

    _fields_ = [("codes", _P), ("order", _P), ("classes", _P), ("shift", _P), ("offset", _P), ("low", _P),
                ("freq", _P), ("streams", _I), ("length", _I), ("models", _I), ("symbols", _I), ("words", _P),
                ("capacity", _I), ("sizes", _P)]


class _Costs(ctypes.Structure):
    """AnsCosts in ans_cpu.c."""

    _fields_ = [("y", _P), ("y_b", _I), ("y_s", _I), ("batch", _I), ("rows", _I), ("columns", _I), ("step", _P),
                ("shift", _P), ("classes", _P), ("costs", _P), ("models", _I), ("limit", _I), ("per_row", _P)]


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library, "compiled C (...)") or (None, "reference (why not)"): built at most once per process
    (CODECKV_CPU_KERNEL is read by its callers at every call, so a test may turn the library off and on)."""
    lib, compiler = compiled("ans_cpu", (SOURCE,), FLAGS)
    if lib is None:
        return None, f"reference ({compiler})"
    for name, struct in (("ans_encode", _Encode), ("ans_costs", _Costs)):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(struct)]
    lib.ans_capacity.restype = ctypes.c_int64
    lib.ans_capacity.argtypes = [ctypes.c_int64]
    return lib, f"compiled C ({compiler} -march=native)"


def _disabled() -> bool:
    return os.environ.get(DISABLE_VARIABLE, "1") == "0"


def ans_status() -> str:
    """"compiled C (...)" where the library runs here, else "reference (why not)"."""
    return f"reference ({DISABLE_VARIABLE}=0)" if _disabled() else _library()[1]


def ans_available() -> bool:
    """True where the compiled coder and cost pass run (else the callers run their references)."""
    return not _disabled() and _library()[0] is not None


def _kernel() -> ctypes.CDLL:
    lib = _library()[0]
    if lib is None:
        raise RuntimeError(f"ans_cpu: the library is not built here: {ans_status()}")
    return lib


def _ptr(array: np.ndarray) -> int:
    return array.ctypes.data


def _array(x, dtype) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=dtype)


def ans_encode(codes: np.ndarray, order: np.ndarray, classes: np.ndarray, shift: np.ndarray, offset: np.ndarray,
               low: np.ndarray, frequency: np.ndarray) -> list[bytes]:
    """S streams of L symbols each -> their bytes (ans_cpu.c: the coder and the symbols' order).

    codes (S, L) int: each stream's codes in natural order; order (L,) the natural position of the t-th symbol
    coded; classes (L,) its base class; shift (S,) each stream's; offset (K,) M_k; low, frequency (K, n) each
    model's fixed-point cumulatives and frequencies. ValueError on a class outside 0..K-1.
    """
    lib = _kernel()
    codes = _array(codes, np.int32)
    count, length = codes.shape
    order, classes = _array(order, np.int64), _array(classes, np.int32)
    shift, offset = _array(shift, np.int32), _array(offset, np.int32)
    models, symbols = low.shape
    low, frequency = _array(low, np.uint32), _array(frequency, np.uint32)
    if order.shape != (length,) or classes.shape != (length,) or shift.shape != (count,) or offset.shape != (models,) \
            or frequency.shape != low.shape or (length and not 0 <= int(order.min()) <= int(order.max()) < length):
        raise ValueError(f"ans_cpu: codes {codes.shape}, order {order.shape}, classes {classes.shape}, shift "
                         f"{shift.shape}, offset {offset.shape}, tables {low.shape} / {frequency.shape} do not match")
    if int(offset.min(initial=0)) < 0 or 2 * int(offset.max(initial=0)) + 1 >= symbols:
        raise ValueError(f"ans_cpu: offsets up to {int(offset.max())} need {2 * int(offset.max()) + 2} symbols "
                         f"per model (the tables have {symbols})")
    capacity = int(lib.ans_capacity(length))
    words = np.empty((count, capacity), dtype=np.uint32)
    sizes = np.zeros(count, dtype=np.int64)

    call = _Encode(_ptr(codes), _ptr(order), _ptr(classes), _ptr(shift), _ptr(offset), _ptr(low), _ptr(frequency),
                   count, length, models, symbols, _ptr(words), capacity, _ptr(sizes))
    if lib.ans_encode(ctypes.byref(call)) != 0:
        raise ValueError(f"ans_cpu: symbols of classes {int(classes.min())}..{int(classes.max())} at shifts "
                         f"{sorted(set(shift.tolist()))} fall outside models 0..{models - 1}")
    return [words[i, :size].tobytes() for i, size in enumerate(sizes.tolist())]


def ans_costs(y: torch.Tensor, steps: torch.Tensor, shift: torch.Tensor, classes: torch.Tensor, costs: torch.Tensor,
              limit: int) -> torch.Tensor:
    """(B, S, r) float32 components, each row's step (S,) and class shift (S,), the columns' classes (r,), a
    (K * (2 limit + 3),) integer cost table (each below 2^31) -> (S,) int64: per row, the summed cost of its
    codes (module docstring)."""
    lib = _kernel()
    if y.dtype != torch.float32 or y.dim() != 3 or y.device.type != "cpu":
        raise ValueError(f"ans_cpu: components (B, S, r) float32 on the CPU expected, not {tuple(y.shape)} "
                         f"{y.dtype} on {y.device}")
    y = y if y.stride(-1) == 1 else y.contiguous()
    batch, rows, columns = y.shape
    width = 2 * limit + 3
    steps = steps.float().contiguous()
    shift, classes = shift.to(torch.int32).contiguous(), classes.to(torch.int32).contiguous()
    costs = costs.to(torch.int32).contiguous()  # a code's cost is below 2^31 (40 bits in 1 / 2^16 units)
    if steps.shape != (rows,) or shift.shape != (rows,) or classes.shape != (columns,) or costs.numel() % width:
        raise ValueError(f"ans_cpu: steps {tuple(steps.shape)}, shifts {tuple(shift.shape)}, classes "
                         f"{tuple(classes.shape)}, {costs.numel()} costs do not fit components {tuple(y.shape)}")
    per_row = torch.empty(rows, dtype=torch.int64)
    call = _Costs(y.data_ptr(), y.stride(0), y.stride(1), batch, rows, columns, steps.data_ptr(), shift.data_ptr(),
                  classes.data_ptr(), costs.data_ptr(), costs.numel() // width, limit, per_row.data_ptr())
    status = lib.ans_costs(ctypes.byref(call))
    if status == 3:
        raise MemoryError("ans_cpu: ans_costs could not allocate its row of column offsets")
    if status != 0:
        raise ValueError(f"ans_cpu: columns of classes {int(classes.min())}..{int(classes.max())} at shifts "
                         f"{sorted(set(shift.tolist()))} fall outside models 0..{costs.numel() // width - 1}")
    return per_row
