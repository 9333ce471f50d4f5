"""kernels.bench's roofline columns: the bytes each op must move, their time at a GPU's bandwidth, the Triton ratio."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from codeckv.tiers import TIERS
from kernels import bench
from kernels.roofline import BOUND_GPUS, bound_ms, device_bandwidth

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("label, bandwidth", [
    ("nvidia-h200", 4.8e12),
    ("nvidia-h100-80gb-hbm3", 3.35e12),
    ("nvidia-h100-pcie", 2.0e12),
    ("nvidia-a100-sxm4-80gb", 2.0e12),
    ("nvidia-a100-sxm4-40gb", 1.555e12),
    ("tesla-t4", 320e9),
    ("nvidia-l40s", 864e9),
    ("nvidia-l4", 300e9),
    ("cpu", None),
])
def test_device_bandwidth_by_label(label, bandwidth):
    assert device_bandwidth(label) == bandwidth


def test_bound_is_bytes_over_bandwidth():
    assert BOUND_GPUS == {"h200": 4.8e12, "a100": 2.0e12, "t4": 320e9}
    assert math.isclose(bound_ms(4.8e9, "h200"), 1.0) and math.isclose(bound_ms(320e6, "t4"), 1.0)


def test_roofline_columns_and_the_triton_ratio_on_a_known_gpu():
    traffic = bench.Traffic(read=3 * 2**20, written=2**20)  # 4 MiB moved
    row = bench._roofline(traffic, triton_ms=2 * 4 * 2**20 / 4.8e9, device="nvidia-h200")
    assert row["read_mib"] == "3.000" and row["write_mib"] == "1.000"
    assert row["h200_bound_ms"] == "0.0008738" and row["t4_bound_ms"] == "0.01311", "4 MiB at 4.8 TB/s, 320 GB/s"
    assert row["triton_vs_roofline"] == "2.00", "twice the time the bytes take at 4.8 TB/s"
    assert bench._roofline(traffic, triton_ms=1.0, device="cpu")["triton_vs_roofline"] == "n/a"
    assert bench._roofline(traffic, triton_ms=None, device="nvidia-h200")["triton_vs_roofline"] == "n/a"


def test_every_op_moves_its_stored_bytes(monkeypatch):
    """decode_attention reads the archive, the raw tail and the query; a decoder writes the tokens it reads."""
    monkeypatch.setattr(bench, "KV_HEADS", 1)
    monkeypatch.setattr(bench, "Q_HEADS", 2)
    monkeypatch.setattr(bench, "HEAD_DIM", 64)
    tier = TIERS["turbo-4"]
    found = {op: (archive_mib, traffic) for op, _, archive_mib, traffic in
             bench._cases("turbo-4", 100, torch.device("cpu"), torch.float32, gpu=False)}
    assert set(found) == {"decode_attention", "rotate_quant", "dequant_rotate"}
    archived = 96  # whole groups of 32 tokens before the raw tail
    coded = sum(tier.key.nbytes(tier.key.encode(torch.zeros(1, 1, archived, 64))) for _ in (0,))
    coded += tier.value.nbytes(tier.value.encode(torch.zeros(1, 1, archived, 64)))
    raw, query = 2 * 4 * 64 * 4, 2 * 64 * 4  # 4 raw tokens, keys and values; 2 query heads; float32
    archive_mib, traffic = found["decode_attention"]
    assert (traffic.read, traffic.written) == (coded + raw + query, query)
    assert archive_mib == (coded + raw) / 2**20
    tokens = archived * 64 * 4
    encode, decode = found["rotate_quant"][1], found["dequant_rotate"][1]
    assert encode.read == decode.written == tokens and encode.written == decode.read
    assert decode.read == tier.value.nbytes(tier.value.encode(torch.zeros(1, 1, archived, 64)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="scripts/gpu_check.sh runs it on the GPU")
def test_device_check_needs_a_gpu(tmp_path):
    run = subprocess.run([sys.executable, "-m", "kernels.device_check", "--out", str(tmp_path / "check.csv")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and "no CUDA device" in run.stderr and not (tmp_path / "check.csv").exists()


def test_the_table_and_csv_carry_the_roofline(monkeypatch, tmp_path, capsys):
    """A tiny CPU run end to end: every row has the three bounds; no GPU ran Triton, so no ratio."""
    monkeypatch.setattr(bench, "TIER_NAMES", ("jpeg-k2-int8",))
    monkeypatch.setattr(bench, "KV_HEADS", 1)
    monkeypatch.setattr(bench, "Q_HEADS", 2)
    monkeypatch.setattr(bench, "HEAD_DIM", 64)
    out = tmp_path / "bench.csv"
    bench.run([64], 1, out)
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert [row["op"] for row in rows] == ["decode_attention", "dct_encode", "dct_decode"]
    for row in rows:
        assert all(float(row[f"{gpu}_bound_ms"]) > 0 for gpu in BOUND_GPUS) and row["triton_vs_roofline"] == "n/a"
        assert float(row["read_mib"]) > 0 and float(row["write_mib"]) >= 0  # 3 decimals: a query's write rounds to 0
    assert "H200 ms" in capsys.readouterr().out
