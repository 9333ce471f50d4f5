"""python -m kernels.device_check: on a GPU, the registers and spills of the Triton kernels as the driver loaded
them, beside what kernels.compile_check computes for the very same launches, so a GPU run shows that the
compile check (which needs no GPU) tells the truth.

    python -m kernels.device_check --out assets/kernels-resources-check-nvidia-h200.csv

The launches are those kernels.compile_check describes, made here on CUDA tensors, for a subset: the
default tier turbo-4 and jpeg-k2-int8 (all six kernels), head_dim 64 and 128, 1 and 8 query rows per
KV head, bfloat16 tokens. Each runs once; Triton's compiled kernel then holds what the driver reports
(registers per thread, local memory per thread: the stack, spills included), and compile_check compiles
the same launch for the device's architecture and reads its cubin with cuobjdump. `match` is "yes" when
both registers and local bytes agree. Exits with status 1 if any launch disagrees, or without a GPU.
Needs TRITON_INTERPRET unset or 0.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch

from .compile_check import cases, compile_job, job

TIERS = ("turbo-4", "jpeg-k2-int8")
HEAD_DIMS = (64, 128)
QUERY_ROWS = (1, 8)
DTYPE = "bfloat16"
COLUMNS = ("kernel", "role", "tier", "side", "head_dim", "query_rows", "arch", "device_registers",
           "compiled_registers", "device_local_bytes", "compiled_stack_bytes", "match")


def check() -> list[dict]:
    """Launch every case on the GPU and compare the driver's figures with the compile check's."""
    major, minor = torch.cuda.get_device_capability()
    arch = major * 10 + minor
    table = []
    for case in cases(list(TIERS), list(HEAD_DIMS), list(QUERY_ROWS), [DTYPE], device="cuda"):
        loaded = case.launch()  # Triton's CompiledKernel, its handles loaded by the driver
        compiled = compile_job(job(case.launch, arch))
        local = compiled.stack_bytes + compiled.local_bytes
        agree = loaded.n_regs == compiled.registers and loaded.n_spills == local
        table.append({
            "kernel": case.kernel, "role": case.role, "tier": case.tier, "side": case.side,
            "head_dim": case.head_dim, "query_rows": case.query_rows or "", "arch": f"sm_{arch}",
            "device_registers": loaded.n_regs, "compiled_registers": compiled.registers,
            "device_local_bytes": loaded.n_spills, "compiled_stack_bytes": local, "match": "yes" if agree else "NO",
        })
        print("  ".join(str(table[-1][c]) for c in COLUMNS), flush=True)
    torch.cuda.synchronize()
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="CSV path")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("kernels.device_check: torch sees no CUDA device (kernels.compile_check needs none)")
    print("  ".join(COLUMNS))
    table = check()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(table)
    differ = [row for row in table if row["match"] != "yes"]
    print(f"wrote {args.out}: {len(table) - len(differ)} of {len(table)} launches agree with the compile check")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
