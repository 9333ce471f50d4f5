"""python -m kernels.compile_check: every Triton kernel configuration the tiers use, compiled for sm_80 and sm_90
on a machine without a GPU; registers, spills, shared memory and the occupancy they allow, as a CSV.

    python -m kernels.compile_check                  # everything below; writes assets/kernels-resources.csv
    python -m kernels.compile_check --tiers turbo-4 --head-dims 128 --archs 90 --out /tmp/resources.csv

What it compiles: for every tier in codeckv.tiers.TIERS whose key and value codecs declare a row layout
(kernels/layout.py; png and the PCA tiers have none and never reach a kernel), at head_dim 64 and 128, with
float16, bfloat16 and float32 tokens:

    encoders    dct_encode or rotate_quant, keys and values: whatever kernels.ops.encode launches for them
    decoders    dct_decode or dequant_rotate, keys and values (kernels.ops.decode)
    attention   decode_attention_triton on [archive, raw tail] for 1 to 8, 16 and 64 query rows per KV
                head: its launch on the coded span, its launch on the raw spans and the combine. On CUDA
                the attention kernel runs without a mask only (kernels/ops.py), that is for decode steps:
                G query heads per KV head times T = 1 new token. 1..8 covers the GQA groups of common
                models (smollm2-135m 3, gemma3-270m 4); a program takes at most MAX_QUERY_ROWS = 16 rows
                (more run as several programs), so 16 and 64 (a multi-query model) complete the tile
                shapes the kernel is ever compiled with. Prefill chunks carry a causal mask and attend
                through torch. The encoders and decoders take prefill chunks: their constexprs do not
                depend on the chunk's length.

Nothing is written by hand: each launcher describes its launches (`*_launch` / `decode_attention_launches`,
a kernels.triton_helpers.Launch) from small CPU tensors, exactly as it would before running them (on a GPU,
kernels.device_check runs the same descriptions and compares what the driver loaded); the
description goes through the argument binder Triton's JITFunction.run uses (the same signature,
constexprs, divisibility attributes and options as a launch on a GPU), then through triton.compile for
GPUTarget("cuda", arch, 32) with the ptxas of the Triton wheel. `cuobjdump --dump-resource-usage` reads
each cubin: registers per thread, stack bytes (spills), static shared memory; Triton's dynamic shared
memory comes with the compiled kernel. No CUDA driver is needed. The integer arguments Triton
specializes (on their divisibility by 16: strides, head counts; the attention kernels' token and split
counts are not specialized) take the values of the sizes used here, 2 KV heads, 512 archived tokens and
3 raw ones, which stand for every size.

Occupancy, per SM (sm_80 and sm_90 alike but for shared memory): 65536 registers allocated per warp in
units of 256, at most 64 warps and 32 programs, 164 KiB (sm_80) / 228 KiB (sm_90) of shared memory with
1 KiB reserved per program. programs_per_sm = the smallest of the four limits, warps_per_sm =
programs_per_sm * num_warps, limited_by names the limit that binds.

Rows are distinct compiled kernels: launches that compile to the same kernel (the coded-span launch does
not depend on the tokens' dtype; the raw-spans launch and the combine do not depend on the tier) share a
row that lists them. A row over the target (more than TARGET_REGISTERS registers, or any spill) says so in
`note`; no row does today (the figures before and after the kernels were reworked for it:
kernels/NOTES-for-docs.md). The run compiles in parallel (--jobs) into a fresh Triton cache (--cache-dir
keeps one), and exits with status 1 if any configuration fails to compile (each failure printed).
Needs TRITON_INTERPRET unset or 0: under the interpreter the kernels are Python functions.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

from codeckv.codecs.layout import RowLayout
from codeckv.tiers import TIERS

from .dct_decode import dct_decode_launch, dct_decode_supported
from .dct_encode import dct_encode_launch, dct_encode_supported
from .decode_attention import decode_attention_launches
from .dequant_rotate import dequant_rotate_launch, dequant_rotate_supported
from .layout import layout_of
from .resources import SM_LIMITS, Resources, occupancy
from .rotate_quant import rotate_quant_launch, rotate_quant_supported
from .segments import Coded, Raw
from .triton_helpers import Launch

ARCHS = (80, 90)
HEAD_DIMS = (64, 128)
QUERY_ROWS = (*range(1, 9), 16, 64)  # G * T query rows per KV head of a decode step (module docstring)
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
KV_HEADS, ARCHIVED, RAW_TAIL = 2, 512, 3  # sizes of the launches described (they stand for every size)
TARGET_REGISTERS = 128  # a row above this, or with any spill, says so in `note`
OUT = Path("assets") / "kernels-resources.csv"
KERNELS = ("_decode_attention_kernel", "_combine_kernel", "_dct_encode_kernel", "_dct_decode_kernel",
           "_rotate_quant_kernel", "_dequant_rotate_kernel")  # every Triton kernel in kernels/
TILE_CONSTEXPRS = ("NQ_P", "BLOCK_NB", "BLOCK_S", "BLOCK_T", "ROWS", "R_P", "K_P", "D_P", "DV_P", "NG_P", "GW_P",
                   "SLAB")  # the constexprs that size a program's tiles, shown in the `tile` column


def row_layout_tiers() -> list[str]:
    """The tiers whose key and value codecs both declare a row layout: the ones that reach the kernels."""
    return [name for name, tier in TIERS.items() if tier.key is not None and tier.value is not None
            and all(isinstance(layout_of(codec), RowLayout) for codec in (tier.key, tier.value))]


@dataclass(frozen=True)
class Case:
    """One launch a tier makes at run time, and what it stands for."""

    kernel: str  # the Triton kernel's name
    role: str  # what the launch covers: "encode", "decode", "coded span", "raw spans", "combine"
    tier: str
    side: str  # "K", "V" or "K+V"
    head_dim: int
    query_rows: int | None  # query rows per KV head (attention launches only)
    dtype: str  # the tokens' dtype
    launch: Launch


def _kv(head_dim: int, dtype: torch.dtype, seed: int, device: str) -> torch.Tensor:
    """(1, KV_HEADS, ARCHIVED, head_dim) KV-like tokens: a random walk plus noise."""
    g = torch.Generator().manual_seed(seed)
    x = (0.1 * torch.randn(1, KV_HEADS, ARCHIVED, head_dim, generator=g)).cumsum(2)
    return (x + torch.randn(x.shape, generator=g)).to(device, dtype)


def cases(tiers: list[str], head_dims: list[int], query_rows: list[int], dtypes: list[str],
          device: str = "cpu") -> Iterator[Case]:
    """Every launch the tiers make, described by the launchers themselves on tensors on `device`."""
    for name in tiers:
        tier = TIERS[name]
        for head_dim in head_dims:
            for dtype in dtypes:
                tokens = {side: _kv(head_dim, DTYPES[dtype], seed, device) for seed, side in enumerate("KV", 1)}
                stored = {}
                for side, codec in (("K", tier.key), ("V", tier.value)):
                    x = tokens[side]
                    enc = stored[side] = codec.encode(x)
                    for role, launch in _codec_launches(codec, x, enc):
                        yield Case(launch.kernel.__name__, role, name, side, head_dim, None, dtype, launch)
                segments = [Coded(tier.key, stored["K"], tier.value, stored["V"]),
                            Raw(tokens["K"][:, :, :RAW_TAIL], tokens["V"][:, :, :RAW_TAIL])]
                for rows in query_rows:
                    query = torch.zeros(1, KV_HEADS * rows, 1, head_dim, dtype=DTYPES[dtype], device=device)
                    launches, _ = decode_attention_launches(query, segments)
                    if len(launches) != 3:  # coded span, raw spans, combine: in this order
                        raise RuntimeError(f"decode_attention_launches made {len(launches)} launches, expected 3")
                    for role, launch in zip(("coded span", "raw spans", "combine"), launches):
                        yield Case(launch.kernel.__name__, role, name, "K+V", head_dim, rows, dtype, launch)


def _codec_launches(codec, x: torch.Tensor, enc) -> Iterator[tuple[str, Launch]]:
    """The encoder's and the decoder's launch for one side, as kernels.ops.encode / decode pick them."""
    if dct_encode_supported(x, codec):
        yield "encode", dct_encode_launch(x, codec)[0]
    elif rotate_quant_supported(x, codec):
        yield "encode", rotate_quant_launch(x, codec)[0]
    if dct_decode_supported(enc, codec):
        yield "decode", dct_decode_launch(enc, codec)[0]
    elif dequant_rotate_supported(enc, codec):
        yield "decode", dequant_rotate_launch(enc, codec)[0]


# ----------------------------------------------------------------------------------------------------------------
# Compiling


@dataclass(frozen=True)
class Job:
    """What triton.compile needs for one launch on one architecture (picklable: sent to a worker process)."""

    module: str  # where the kernel lives, to import it in the worker
    kernel: str
    arch: int
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict

    @property
    def key(self) -> str:
        """Identity of the compiled kernel: equal keys compile to the same binary."""
        return repr((self.module, self.kernel, self.arch, sorted(self.signature.items()),
                     sorted(self.constexprs.items()), sorted(self.attrs.items()), sorted(self.options.items())))

    def tile(self) -> str:
        """The tile-sizing constexprs and num_warps, e.g. "NQ_P=8 BLOCK_NB=8 D_P=128 num_warps=4"."""
        names = {path: name for name, path in _constexpr_paths(self.module, self.kernel).items()}
        shown = [f"{names[p]}={v}" for p, v in self.constexprs.items() if names.get(p) in TILE_CONSTEXPRS]
        return " ".join([*shown, f"num_warps={self.options['num_warps']}"])


def _constexpr_paths(module: str, kernel: str) -> dict[str, tuple[int]]:
    """Argument name -> the (index,) path triton keys constexprs by."""
    fn = getattr(sys.modules[module], kernel)
    return {name: (i,) for i, name in enumerate(fn.arg_names)}


def job(launch: Launch, arch: int) -> Job:
    """The compile job of `launch` for sm_`arch`: Triton's own binder on the launch's arguments (module docstring)."""
    kernel = launch.kernel
    if not isinstance(kernel, triton.JITFunction):
        raise RuntimeError("kernels.compile_check: the kernels are interpreted (TRITON_INTERPRET=1); run it with "
                           "TRITON_INTERPRET=0")
    backend = make_backend(GPUTarget("cuda", arch, 32))
    bind = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = bind(*launch.args, **launch.kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, launch.kwargs, bound, specialization, options)
    return Job(kernel.fn.__module__, kernel.__name__, arch, signature, constexprs, attrs, dict(options.__dict__))


_USAGE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def compile_job(job: Job) -> Resources:
    """Compile one job (in a worker process) and read its cubin's resource usage."""
    import importlib

    kernel = getattr(importlib.import_module(job.module), job.kernel)
    target = GPUTarget("cuda", job.arch, 32)
    compiled = triton.compile(ASTSource(kernel, job.signature, job.constexprs, job.attrs), target=target,
                              options=job.options)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "--dump-resource-usage", cubin.name],
                               capture_output=True, text=True, check=True).stdout
    found = _USAGE.search(usage)
    if found is None:
        raise RuntimeError(f"cuobjdump gave no resource usage for {job.kernel}:\n{usage}")
    registers, stack, static_shared, local = (int(v) for v in found.groups())
    return Resources(registers, stack, local, static_shared + compiled.metadata.shared, job.options["num_warps"])


# ----------------------------------------------------------------------------------------------------------------
# The CSV

COLUMNS = ("kernel", "role", "tiers", "sides", "head_dim", "query_rows", "dtypes", "arch", "tile", "registers",
           "stack_bytes", "local_bytes", "shared_bytes", "programs_per_sm", "warps_per_sm", "limited_by", "note")


def _spans(values: list[int]) -> str:
    """Sorted integers as runs: [1, 2, 3, 5] -> "1-3 5"."""
    runs: list[list[int]] = []
    for v in sorted(set(values)):
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return " ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _listed(values: list[str], everything: list[str], word: str) -> str:
    """Distinct values in `everything`'s order, or "every <word>" when they are all of them."""
    distinct = [v for v in everything if v in set(values)]
    return f"every {word}" if len(distinct) == len(everything) > 1 else " ".join(distinct)


def note(resources: Resources) -> str:
    """What misses the target (over TARGET_REGISTERS registers, or spilling), empty when the kernel meets it."""
    problems = []
    if resources.registers > TARGET_REGISTERS:
        problems.append(f"{resources.registers} registers > {TARGET_REGISTERS}")
    if resources.stack_bytes or resources.local_bytes:
        problems.append(f"spills: {resources.stack_bytes} bytes of stack, {resources.local_bytes} of local memory")
    return "; ".join(problems)


def rows(found: list[tuple[Case, Job]], resources: dict[str, Resources]) -> list[dict]:
    """One CSV row per distinct compiled kernel, listing the tiers, sides, query rows and dtypes behind it."""
    groups: dict[tuple, list[tuple[Case, Job]]] = {}
    for case, j in found:
        groups.setdefault((case.kernel, case.role, j.key), []).append((case, j))
    table = []
    for (kernel, role, key), members in groups.items():
        j = members[0][1]
        used = resources[key]
        limits = occupancy(used, SM_LIMITS[j.arch])
        query_rows = [c.query_rows for c, _ in members if c.query_rows is not None]
        table.append({
            "kernel": kernel, "role": role,
            "tiers": _listed([c.tier for c, _ in members], row_layout_tiers(), "tier"),
            "sides": _listed([c.side for c, _ in members], ["K", "V", "K+V"], "side"),
            "head_dim": _spans([c.head_dim for c, _ in members]),
            "query_rows": _spans(query_rows) if query_rows else "",
            "dtypes": _listed([c.dtype for c, _ in members], list(DTYPES), "dtype"),
            "arch": f"sm_{j.arch}", "tile": j.tile(), "registers": used.registers, "stack_bytes": used.stack_bytes,
            "local_bytes": used.local_bytes, "shared_bytes": used.shared_bytes,
            "programs_per_sm": limits.programs, "warps_per_sm": limits.warps, "limited_by": limits.limited_by,
            "note": note(used),
        })
    return sorted(table, key=lambda r: (r["kernel"], r["role"], r["arch"], r["tiers"], r["head_dim"], r["query_rows"]))


def compile_all(distinct: dict[str, Job], workers: int) -> tuple[dict[str, Resources], list[str]]:
    """Compile every job in `workers` processes: the resources of those that compile, and a line per failure."""
    resources: dict[str, Resources] = {}
    failures = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {key: pool.submit(compile_job, j) for key, j in distinct.items()}
        for key, future in futures.items():
            try:
                resources[key] = future.result()
            except Exception as err:  # noqa: BLE001 -- every failure is reported, and the run fails at the end
                j = distinct[key]
                failures.append(f"{j.kernel} sm_{j.arch} {j.tile()}: {type(err).__name__}: {err}")
    return resources, failures


def run(tiers: list[str], head_dims: list[int], query_rows: list[int], dtypes: list[str], archs: list[int],
        kernels: list[str], workers: int, out: Path) -> tuple[list[dict], list[str]]:
    """Compile every configuration of `kernels`; write the CSV; return its rows and the failures."""
    start = time.perf_counter()
    with torch.inference_mode():
        found = [(case, job(case.launch, arch)) for case in cases(tiers, head_dims, query_rows, dtypes)
                 if case.kernel in kernels for arch in archs]
    distinct = {j.key: j for _, j in found}
    print(f"{len(found)} launches, {len(distinct)} distinct kernels to compile for {' '.join(f'sm_{a}' for a in archs)}"
          f" ({time.perf_counter() - start:.1f}s to describe them)", flush=True)
    resources, failures = compile_all(distinct, workers)
    table = rows([(c, j) for c, j in found if j.key in resources], resources)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(table)
    _print(table)
    print(f"\n{len(distinct)} kernels compiled in {time.perf_counter() - start:.1f}s; wrote {out}")
    return table, failures


def _print(table: list[dict]) -> None:
    shown = ("kernel", "role", "arch", "head_dim", "query_rows", "registers", "stack_bytes", "shared_bytes",
             "programs_per_sm", "warps_per_sm", "tiers")
    print("  ".join(shown))
    for row in table:
        print("  ".join(str(row[c]) for c in shown))


def build_parser() -> argparse.ArgumentParser:
    """The command line of python -m kernels.compile_check."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    every = row_layout_tiers()
    parser.add_argument("--tiers", nargs="+", default=every, choices=every, help="default: every tier with a layout")
    parser.add_argument("--head-dims", nargs="+", type=int, default=list(HEAD_DIMS))
    parser.add_argument("--query-rows", nargs="+", type=int, default=list(QUERY_ROWS),
                        help="query rows per KV head of the attention launches (default 1 to 8)")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--archs", nargs="+", type=int, default=list(ARCHS), choices=list(SM_LIMITS))
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiler processes")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="Triton cache to use and keep (default: a fresh one, removed afterwards)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"CSV path (default {OUT})")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    with tempfile.TemporaryDirectory(prefix="triton-cache-") as fresh:
        os.environ["TRITON_CACHE_DIR"] = str(args.cache_dir or fresh)  # the workers inherit it
        _, failures = run(args.tiers, args.head_dims, args.query_rows, args.dtypes, args.archs, args.kernels,
                          args.jobs, args.out)
    for failure in failures:
        print(f"FAILED {failure}", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
