"""python -m kernels.bench: Triton vs torch reference vs materialize + SDPA, per op and context length.

    python -m kernels.bench                       # --quick: contexts 1k, 4k, 16k
    python -m kernels.bench --lengths 1024,65536  # up to 64k
    python -m kernels.bench --heads 3,9,64 --lengths 1024,4096,8192 --tiers turbo-4 int8   # smollm2-135m's heads

Headline configuration: B=1, 8 KV heads, 16 query heads, head_dim 128, tiers jpeg-k8-int8, jpeg-k2-int8
and turbo-4; bf16 on a GPU, fp32 on CPU. decode_attention rows: one query per head on the archive and a
raw tail; prefill_attention rows: the last PREFILL_CHUNK-token chunk of a chunked prefill (the chunk raw,
causal, after the archive of the rest). Each row: median milliseconds over the repetitions and the
peak extra memory of one call (CUDA allocator peak on a GPU; the process's peak RSS on CPU, with glibc
told to mmap every block over 64 KiB for that call and its free heap pages trimmed, so that the RSS
tracks what is in use). The timed calls run
with glibc's heap serving blocks up to 32 MiB, as in a warmed-up process (glibc's dynamic mmap threshold
rises to that), so that neither method pays a page fault per allocation; slow methods get fewer
repetitions (TIME_BUDGET_S). Methods:

    triton        the Triton kernel (GPU only; "n/a" on CPU)
    torch         decode_attention only: decode_attention_torch, the fast path the CPU uses (codes without a DCT on the
                  compiled kernel, kernels/codes_cpu.py, where it is built; the printout says whether)
    reference     the torch reference (decode_attention: chunked, in the coefficient / rotated domain)
    materialized  decode_attention only: decode K and V to (S, D), then SDPA
    native_sdpa   decode_attention only: SDPA on uncompressed K/V in the bench dtype (no codec)

decode_attention rows also give archive_mib (the stored codes and raw tokens the kernels read),
torch_vs_sdpa (torch ms / native_sdpa ms) and torch_peak_vs_archive (torch peak MiB / archive_mib).

The roofline (kernels/roofline.py), on every row: read_mib, the bytes the op must read (attention: the
codes, scales, zeros and raw tokens, and the queries; an encoder: the tokens; a decoder: the codes,
scales and zeros), write_mib, the bytes it must write (an encoder's codes, a decoder's tokens, four
times what it reads: a bound on reads alone would flatter the decoders), and the time moving both takes
at the HBM bandwidth of an H200 (4.8 TB/s), an A100 (2.0 TB/s) and a T4 (320 GB/s): h200_bound_ms,
a100_bound_ms, t4_bound_ms. Where the Triton kernel ran on a GPU whose bandwidth is known,
triton_vs_roofline = triton ms / that GPU's bound: how far the kernel is from the limit.
Prints a table and writes CSV to out/kernels-bench-<device>.csv (`--threads N`: torch threads on CPU).
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import math
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from codeckv.tiers import TIERS

from . import Coded, Raw
from .codes_cpu import codes_status
from .dct_decode import dct_decode_ref, dct_decode_triton
from .dct_encode import dct_encode_ref, dct_encode_triton
from .decode_attention import decode_attention_ref, decode_attention_triton
from .decode_attention_torch import decode_attention_torch
from .dequant_rotate import dequant_rotate_ref, dequant_rotate_triton
from .layout import layout_of
from .roofline import BOUND_GPUS, bound_ms, device_bandwidth
from .rotate_quant import rotate_quant_ref, rotate_quant_triton

BATCH, KV_HEADS, Q_HEADS, HEAD_DIM = 1, 8, 16, 128
TIER_NAMES = ("jpeg-k8-int8", "jpeg-k2-int8", "turbo-4")
QUICK_LENGTHS = (1024, 4096, 16384)
METHODS = ("triton", "torch", "reference", "materialized", "native_sdpa")
PREFILL_CHUNK = 512  # queries of the prefill_attention rows (the chunk of a chunked prefill)
TIME_BUDGET_S = 3.0  # timed repetitions of one method stop near this many seconds (at least one)
_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
_MMAP_FOR_MEMORY = 1 << 16  # blocks above this come from mmap while the peak memory is measured
_MMAP_FOR_TIMING = 32 << 20  # glibc's largest dynamic threshold (64-bit): the heap serves and reuses blocks


class Meter:
    """Median time and peak extra memory of a callable, on CUDA or CPU."""

    def __init__(self, device: torch.device, reps: int) -> None:
        self.device, self.reps = device, reps
        self._libc = ctypes.CDLL("libc.so.6") if device.type == "cpu" else None

    def _mmap_threshold(self, size: int) -> None:
        if self._libc is not None:
            self._libc.mallopt(_M_MMAP_THRESHOLD, size)
            self._libc.malloc_trim(0)  # free heap pages leave the RSS: reusing them counts again

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def measure(self, fn: Callable[[], object]) -> tuple[float, float]:
        """(median ms, peak extra MiB): the first call (warm-up, Triton compilation) gives the peak memory."""
        start = time.perf_counter()
        self._mmap_threshold(_MMAP_FOR_MEMORY)  # large blocks straight from mmap: freed, they leave the RSS
        mib = self.peak_mib(fn)
        self._mmap_threshold(_MMAP_FOR_TIMING)
        first = time.perf_counter() - start
        reps = max(1, min(self.reps, int(TIME_BUDGET_S / max(first, 1e-9))))  # slow references run fewer times
        fn()  # warm the heap for this method's block sizes
        return self.time_ms(fn, reps), mib

    def time_ms(self, fn: Callable[[], object], reps: int) -> float:
        times = []
        for _ in range(reps):
            self._sync()
            start = time.perf_counter()
            fn()
            self._sync()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    def peak_mib(self, fn: Callable[[], object]) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fn()
            torch.cuda.synchronize()
            return (torch.cuda.max_memory_allocated() - base) / 2**20
        with open("/proc/self/clear_refs", "w") as f:  # reset the peak RSS (VmHWM) to the current RSS
            f.write("5")
        base = _status_bytes("VmRSS")
        fn()
        return (_status_bytes("VmHWM") - base) / 2**20


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _kv(tokens: int, device: torch.device, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """(B, KV heads, tokens, head_dim) KV-like data: a random walk along the tokens plus noise."""
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (BATCH, KV_HEADS, tokens, HEAD_DIM)
    x = (0.1 * torch.randn(shape, generator=g, device=device)).cumsum(2)
    return (x + torch.randn(shape, generator=g, device=device)).to(dtype)


def _materialized(query: torch.Tensor, segments: list, dtype: torch.dtype) -> torch.Tensor:
    """Decode every segment to (S, D), then SDPA: what the kernels avoid."""
    keys, values = [], []
    for seg in segments:
        if isinstance(seg, Raw):
            keys.append(seg.keys)
            values.append(seg.values)
        else:
            keys.append(seg.key_codec.decode(seg.keys).to(dtype))
            values.append(seg.value_codec.decode(seg.values).to(dtype))
    return F.scaled_dot_product_attention(query, torch.cat(keys, 2), torch.cat(values, 2), enable_gqa=True)


@dataclass(frozen=True)
class Traffic:
    """The bytes an op must move at least: read and written (module docstring, the roofline)."""

    read: int
    written: int


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _cases(tier_name: str, context: int, device: torch.device, dtype: torch.dtype, gpu: bool):
    """(op, {method: callable}, archive MiB or None, Traffic) for one tier and context length."""
    tier = TIERS[tier_name]
    unit = math.lcm(tier.key.block_tokens, tier.value.block_tokens)
    archived = (context - 1) // unit * unit  # the rest is the raw tail, new token included
    keys, values = _kv(context, device, dtype, 1), _kv(context, device, dtype, 2)
    segments = [
        Coded(tier.key, tier.key.encode(keys[:, :, :archived]), tier.value, tier.value.encode(values[:, :, :archived])),
        Raw(keys[:, :, archived:], values[:, :, archived:]),
    ]
    query = torch.randn(BATCH, Q_HEADS, 1, HEAD_DIM, device=device).to(dtype)
    attention = {
        "triton": (lambda: decode_attention_triton(query, segments)) if gpu else None,
        "torch": lambda: decode_attention_torch(query, segments),
        "reference": lambda: decode_attention_ref(query, segments),
        "materialized": lambda: _materialized(query, segments, dtype),
        "native_sdpa": lambda: F.scaled_dot_product_attention(query, keys, values, enable_gqa=True),
    }
    archive = segments[0].keys.nbytes + segments[0].values.nbytes + _nbytes(segments[1].keys, segments[1].values)
    yield "decode_attention", attention, archive / 2**20, Traffic(archive + _nbytes(query), _nbytes(query))
    if context > PREFILL_CHUNK:
        yield "prefill_attention", *_prefill_case(tier, keys, values, device, dtype)
    if layout_of(tier.key).block > 1:  # a DCT tier: the block encoders
        codec, x, enc = tier.key, keys[:, :, :archived], segments[0].keys
        yield "dct_encode", {"triton": (lambda: dct_encode_triton(x, codec)) if gpu else None,
                             "reference": lambda: dct_encode_ref(x, codec)}, None, Traffic(_nbytes(x), enc.nbytes)
        yield "dct_decode", {"triton": (lambda: dct_decode_triton(enc, codec)) if gpu else None,
                             "reference": lambda: dct_decode_ref(enc, codec)}, None, Traffic(enc.nbytes, _nbytes(x))
    else:
        codec, x, enc = tier.value, values[:, :, :archived], segments[0].values
        yield "rotate_quant", {"triton": (lambda: rotate_quant_triton(x, codec)) if gpu else None,
                               "reference": lambda: rotate_quant_ref(x, codec)}, None, Traffic(_nbytes(x), enc.nbytes)
        yield "dequant_rotate", {"triton": (lambda: dequant_rotate_triton(enc, codec)) if gpu else None,
                                 "reference": lambda: dequant_rotate_ref(enc, codec)}, None, Traffic(enc.nbytes,
                                                                                                    _nbytes(x))


def _prefill_case(tier, keys: torch.Tensor, values: torch.Tensor, device: torch.device, dtype: torch.dtype):
    """A chunked prefill's last chunk: PREFILL_CHUNK queries on the archive (codes) and on themselves, causally.

    torch: decode_attention_torch on [archive, the chunk raw] with the causal mask; native_sdpa: SDPA on the
    dense keys and values with the same mask (what a native chunked prefill runs).
    """
    context = keys.shape[2]
    unit = math.lcm(tier.key.block_tokens, tier.value.block_tokens)
    archived = (context - PREFILL_CHUNK) // unit * unit
    segments = [
        Coded(tier.key, tier.key.encode(keys[:, :, :archived]), tier.value, tier.value.encode(values[:, :, :archived])),
        Raw(keys[:, :, archived:], values[:, :, archived:]),
    ]
    t = context - archived
    query = _kv(t, device, dtype, 3).repeat_interleave(Q_HEADS // KV_HEADS, dim=1)  # (B, Hq, T, D)
    pos = torch.arange(context, device=device)
    mask = (pos[None, :] <= pos[context - t :, None])[None, None]  # (1, 1, T, S)
    methods = {
        "torch": lambda: decode_attention_torch(query, segments, mask=mask),
        "native_sdpa": lambda: F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, enable_gqa=True),
    }
    archive = segments[0].keys.nbytes + segments[0].values.nbytes + _nbytes(segments[1].keys, segments[1].values)
    return methods, archive / 2**20, Traffic(archive + _nbytes(query), _nbytes(query))


def device_label() -> str:
    """The device's name for file names: the GPU's (e.g. "nvidia-h100-80gb-hbm3"), or "cpu"."""
    if not torch.cuda.is_available():
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-")


def run(lengths: list[int], reps: int, out: Path | None) -> list[dict]:
    """Measure every op / tier / length / method; print the table; write the CSV; return the rows."""
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    dtype = torch.bfloat16 if gpu else torch.float32
    label = device_label()
    meter = Meter(device, reps)
    rows = []
    with torch.inference_mode():
        for tier_name in TIER_NAMES:
            for context in lengths:
                for op, methods, archive_mib, traffic in _cases(tier_name, context, device, dtype, gpu):
                    head = {"device": label, "op": op, "tier": tier_name, "context": context, "dtype": str(dtype)[6:],
                            "threads": "n/a" if gpu else torch.get_num_threads()}
                    rows.append(_measure(meter, head, methods, archive_mib, traffic))
                    _print_row(rows[-1], first=len(rows) == 1)
    if out is None:
        out = Path("out") / f"kernels-bench-{label}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"\nwrote {out}")
    return rows


def _measure(meter: Meter, head: dict, methods: dict, archive_mib: float | None, traffic: Traffic) -> dict:
    """One CSV row: every method's median ms and peak MiB, the archive and the fast path's ratios, the roofline."""
    row, measured = dict(head), {}
    for method in METHODS:
        fn = methods.get(method)
        measured[method] = ms, mib = meter.measure(fn) if fn else (None, None)
        row[f"{method}_ms"] = "n/a" if ms is None else f"{ms:.4f}"
        row[f"{method}_peak_mib"] = "n/a" if mib is None else f"{mib:.2f}"
    fast, sdpa = measured["torch"], measured["native_sdpa"]
    row["archive_mib"] = "n/a" if archive_mib is None else f"{archive_mib:.2f}"
    row["torch_vs_sdpa"] = "n/a" if fast[0] is None else f"{fast[0] / sdpa[0]:.3f}"
    row["torch_peak_vs_archive"] = "n/a" if fast[0] is None else f"{fast[1] / archive_mib:.3f}"
    return row | _roofline(traffic, measured["triton"][0], head["device"])


def _roofline(traffic: Traffic, triton_ms: float | None, device: str) -> dict:
    """The roofline columns: bytes read and written, the time they take per GPU, and the Triton time over it."""
    moved = traffic.read + traffic.written
    row = {"read_mib": f"{traffic.read / 2**20:.3f}", "write_mib": f"{traffic.written / 2**20:.3f}"}
    row |= {f"{gpu}_bound_ms": f"{bound_ms(moved, gpu):.4g}" for gpu in BOUND_GPUS}
    bandwidth = device_bandwidth(device)
    known = triton_ms is not None and bandwidth is not None
    row["triton_vs_roofline"] = f"{triton_ms / (moved / bandwidth * 1e3):.2f}" if known else "n/a"
    return row


def _print_row(row: dict, first: bool) -> None:
    cells = [f"{row['op']:<16}", f"{row['tier']:<13}", f"{row['context']:>7}"]
    cells += [f"{row[f'{m}_ms']:>11}" for m in METHODS] + [f"{row[f'{m}_peak_mib']:>11}" for m in METHODS]
    cells += [f"{row['archive_mib']:>11}", f"{row['torch_vs_sdpa']:>9}", f"{row['read_mib']:>9}",
              f"{row['write_mib']:>9}", *(f"{row[f'{gpu}_bound_ms']:>9}" for gpu in BOUND_GPUS),
              f"{row['triton_vs_roofline']:>8}"]
    if first:
        head = [f"{'op':<16}", f"{'tier':<13}", f"{'context':>7}"]
        head += [f"{m[:8] + ' ms':>11}" for m in METHODS] + [f"{m[:7] + ' MiB':>11}" for m in METHODS]
        head += [f"{'arch MiB':>11}", f"{'tch/sdpa':>9}", f"{'read MiB':>9}", f"{'wrt MiB':>9}",
                 *(f"{gpu.upper() + ' ms':>9}" for gpu in BOUND_GPUS), f"{'tri/roof':>8}"]
        print(f"device {row['device']}, B={BATCH} KV heads={KV_HEADS} Q heads={Q_HEADS} head_dim={HEAD_DIM} "
              f"{row['dtype']}, threads {row['threads']}; median ms and peak extra MiB per call; "
              f"codes on the CPU: {codes_status()}")
        print(" ".join(head))
    print(" ".join(cells), flush=True)


def _set_tiers(parser: argparse.ArgumentParser, names: list[str]) -> None:
    """--tiers: the tiers every case is built for."""
    global TIER_NAMES
    unknown = [name for name in names if name not in TIERS]
    if unknown:
        parser.error(f"unknown tiers {unknown} (allowed: {', '.join(TIERS)})")
    TIER_NAMES = tuple(names)


def _set_heads(parser: argparse.ArgumentParser, text: str) -> None:
    """--heads "3,9,64": the KV heads, query heads and head_dim every case is built with."""
    global KV_HEADS, Q_HEADS, HEAD_DIM
    try:
        kv_heads, q_heads, head_dim = (int(part) for part in text.split(","))
    except ValueError:
        parser.error(f"--heads {text!r}: expected KV heads,query heads,head_dim, e.g. 3,9,64")
    if min(kv_heads, q_heads, head_dim) < 1 or q_heads % kv_heads:
        parser.error(f"--heads {text!r}: positive counts with query heads a multiple of KV heads")
    KV_HEADS, Q_HEADS, HEAD_DIM = kv_heads, q_heads, head_dim


def build_parser() -> argparse.ArgumentParser:
    """The command line of python -m kernels.bench."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="contexts 1k, 4k, 16k (the default)")
    parser.add_argument("--lengths", type=str, default=None, help="comma-separated contexts, e.g. 1024,65536")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions (default: 5 on CPU, 50 on GPU)")
    parser.add_argument("--out", type=Path, default=None, help="CSV path (default: out/kernels-bench-<device>.csv)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads on CPU (default: torch's own choice)")
    parser.add_argument("--heads", type=str, default=None,
                        help="KV heads,query heads,head_dim (default 8,16,128; smollm2-135m: 3,9,64)")
    parser.add_argument("--tiers", nargs="+", default=None, help=f"tier names (default {' '.join(TIER_NAMES)})")
    return parser


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    if args.heads:
        _set_heads(parser, args.heads)
    if args.tiers:
        _set_tiers(parser, args.tiers)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick and args.lengths:
        parser.error("--quick and --lengths are exclusive")
    lengths = [int(n) for n in args.lengths.split(",")] if args.lengths else list(QUICK_LENGTHS)
    reps = args.reps or (50 if torch.cuda.is_available() else 5)
    run(lengths, reps, args.out)


if __name__ == "__main__":
    main()
