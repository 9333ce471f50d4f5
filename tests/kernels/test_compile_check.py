"""kernels.compile_check: the Triton kernels compile for sm_80 and sm_90 without a GPU, within their register budget.

The full command (every tier with a row layout x head_dim 64, 128 x 1..8, 16, 64 query rows x three dtypes x
sm_80, sm_90: several hundred kernels) takes about ten minutes on two cores. The test compiles a representative
subset in about a minute: the default tier turbo-4 and jpeg-k2-int8 (between them all six kernels: the
rotate_quant / dequant_rotate pair, the dct_encode / dct_decode pair, the attention kernel on a per-channel,
a Lloyd-Max and a DCT layout, the combine), head_dim 64 and 128, 1 and 8 query rows per KV head (the
smallest and the largest tile of a decode step), bfloat16 tokens, both architectures. It runs as a
subprocess with TRITON_INTERPRET=0, as the command must (the interpreter replaces the kernels here).
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import triton

from kernels import compile_check
from kernels.decode_attention import _combine_kernel
from kernels.resources import SM_LIMITS, Occupancy, Resources, occupancy
from kernels.triton_helpers import Launch

ROOT = Path(__file__).resolve().parents[2]
SUBSET = ["--tiers", "turbo-4", "jpeg-k2-int8", "--head-dims", "64", "128", "--query-rows", "1", "8",
          "--dtypes", "bfloat16", "--archs", "80", "90"]
TARGET_TIERS = ("turbo-4", "jpeg-k2-int8")  # decode attention: no spill, at most TARGET_REGISTERS registers


def _without_interpreter() -> dict[str, str]:
    return {**os.environ, "TRITON_INTERPRET": "0"}


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> list[dict]:
    """The subset's CSV rows, compiled once for the tests below."""
    out = tmp_path_factory.mktemp("compile_check") / "resources.csv"
    run = subprocess.run([sys.executable, "-m", "kernels.compile_check", *SUBSET, "--out", str(out)], cwd=ROOT,
                         env=_without_interpreter(), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"compile check failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    with out.open() as f:
        return list(csv.DictReader(f))


def test_every_kernel_compiles_for_both_architectures(table):
    compiled = {(row["kernel"], row["arch"]) for row in table}
    assert compiled == {(kernel, arch) for kernel in compile_check.KERNELS for arch in ("sm_80", "sm_90")}
    for row in table:
        assert 0 < int(row["registers"]) <= 255, row
        occupied = occupancy(Resources(int(row["registers"]), int(row["stack_bytes"]), int(row["local_bytes"]),
                                       int(row["shared_bytes"]), int(row["tile"].split("num_warps=")[1])),
                             SM_LIMITS[int(row["arch"][3:])])
        assert (int(row["programs_per_sm"]), int(row["warps_per_sm"]), row["limited_by"]) == (
            occupied.programs, occupied.warps, occupied.limited_by), row


def test_it_knows_every_triton_kernel_in_the_package():
    source = "\n".join(path.read_text() for path in (ROOT / "kernels").glob("*.py"))
    assert set(re.findall(r"@triton\.jit(?:\(.*\))?\ndef (_\w+_kernel)\(", source)) == set(compile_check.KERNELS)


def test_decode_attention_of_the_target_tiers_has_no_spill_and_at_most_128_registers(table):
    rows = [row for row in table if row["kernel"] == "_decode_attention_kernel" and row["role"] == "coded span"]
    assert {(row["tiers"], row["head_dim"], row["query_rows"], row["arch"]) for row in rows} == {
        (tier, d, q, arch) for tier in TARGET_TIERS for d in ("64", "128") for q in ("1", "8")
        for arch in ("sm_80", "sm_90")}
    for row in rows + [row for row in table if row["role"] == "raw spans"]:
        assert int(row["registers"]) <= compile_check.TARGET_REGISTERS and row["stack_bytes"] == "0", row
        assert row["note"] == "", row


def test_launches_compiling_to_one_kernel_share_a_row(table):
    raw = [row for row in table if row["role"] == "raw spans"]
    assert raw and all(row["tiers"] == "jpeg-k2-int8 turbo-4" for row in raw), "the raw launch is the same per tier"
    coded = [row for row in table if row["role"] == "coded span"]
    assert all(row["dtypes"] == "bfloat16" and row["sides"] == "K+V" for row in coded)


def test_a_kernel_that_fails_to_compile_is_reported(tmp_path):
    """compile_all returns a failure line (the command then exits with status 1) instead of a row."""
    script = f"""
import dataclasses, sys
sys.path.insert(0, {str(ROOT)!r})
from kernels import compile_check
from kernels.decode_attention import _combine_kernel
(case,) = [c for c in compile_check.cases(["turbo-4"], [64], [1], ["float32"]) if c.role == "combine"]
good = compile_check.job(case.launch, 90)
paths = compile_check._constexpr_paths(good.module, good.kernel)
bad = dataclasses.replace(good, constexprs={{**good.constexprs, paths["BLOCK_S"]: 3}})  # not a power of two
resources, failures = compile_check.compile_all({{bad.key: bad}}, 1)
assert not resources and len(failures) == 1 and failures[0].startswith("_combine_kernel sm_90"), failures
print("reported")
"""
    run = subprocess.run([sys.executable, "-c", script], env=_without_interpreter(), capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert run.returncode == 0 and "reported" in run.stdout, run.stderr[-3000:]


@pytest.mark.skipif(isinstance(_combine_kernel, triton.JITFunction), reason="TRITON_INTERPRET=0 in this run")
def test_under_the_interpreter_it_says_how_to_run_it():
    launch = Launch(_combine_kernel, (1,), ())
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=0"):
        compile_check.job(launch, 90)


@pytest.mark.parametrize("used, arch, expected", [
    (Resources(128, 0, 0, 4096, 4), 90, Occupancy(4, 16, "registers")),  # 4096 registers a warp: 16 warps
    (Resources(40, 0, 0, 2048, 4), 80, Occupancy(12, 48, "registers")),  # 40 -> 1280 a warp: 51 warps
    (Resources(32, 0, 0, 64 * 1024, 4), 80, Occupancy(2, 8, "shared memory")),  # 164 KiB / 65 KiB
    (Resources(32, 0, 0, 64 * 1024, 4), 90, Occupancy(3, 12, "shared memory")),  # 228 KiB / 65 KiB
    (Resources(16, 0, 0, 0, 1), 90, Occupancy(32, 32, "programs")),
    (Resources(24, 0, 0, 0, 8), 90, Occupancy(8, 64, "warps")),  # 24 -> 768 a warp: 85 warps
])
def test_occupancy_takes_the_tightest_limit(used, arch, expected):
    assert occupancy(used, SM_LIMITS[arch]) == expected
