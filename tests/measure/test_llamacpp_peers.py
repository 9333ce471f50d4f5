"""llama.cpp's KV types wherever a peer goes: quality rows against llama.cpp's f16, the needle grid, the latency
command, the app's sweep; absent, one line each. Two short windows and one-cell grids, one thread."""

import csv
import importlib.util

import pytest

from codeckv.cli import main
from codeckv.figures import quality_figures, worst_tier
from codeckv.measure.llamacpp import LLAMACPP_PEERS, llamacpp_absent_reason
from codeckv.measure.needle import needle_grid
from codeckv.measure.peers import run_for
from codeckv.measure.quality import LLAMACPP_REFERENCE_LABEL, as_dicts, measure_quality
from codeckv.serve.formatting import quality_table
from codeckv.tiers import TIERS

Q8, Q4 = LLAMACPP_PEERS["llamacpp-q8_0"], LLAMACPP_PEERS["llamacpp-q4_0"]
installed = pytest.mark.skipif(llamacpp_absent_reason(Q8) is not None, reason="needs scripts/setup.sh --llamacpp")


@installed
def test_quality_rows_of_llamacpp_are_against_its_own_f16(loaded):
    run = measure_quality(loaded, [TIERS["turbo-4"], Q8, Q4], windows=2, length=48)
    rows = {r.tier: r for r in run.rows}
    assert list(rows) == ["native", "turbo-4", "llamacpp-f16", "llamacpp-q8_0", "llamacpp-q4_0"]
    f16, q8, q4 = rows["llamacpp-f16"], rows["llamacpp-q8_0"], rows["llamacpp-q4_0"]
    assert {f16.reference, q8.reference} == {LLAMACPP_REFERENCE_LABEL} and rows["turbo-4"].reference == "native"
    assert f16.kld == 0.0 and f16.top1_pct == 100.0 and f16.ratio_vs_bf16 == 1.0, "its native against itself"
    assert q8.ratio_vs_bf16 == pytest.approx(34 / 64) and q4.ratio_vs_bf16 == pytest.approx(18 / 64)
    assert 0 < q8.kld < q4.kld < 1 and q8.yardstick.kld["max"] >= q8.kld
    assert q8.held_bytes >= q8.archive_bytes, "the KV buffer llama.cpp allocated holds at least the tokens"
    table = quality_table(run.rows)["data"]
    assert table[3][0] == "llamacpp-q8_0 (vs llama.cpp f16)", "every table says what the row is against"
    assert as_dicts(run.rows)[3]["reference"] == LLAMACPP_REFERENCE_LABEL
    assert "llamacpp-q8_0" not in run.scores, "per-token charts compare with transformers' native only"
    assert q4.kld > rows["turbo-4"].kld and worst_tier(run) == "turbo-4", "the worst tier with a per-token chart"
    assert "turbo-4" in quality_figures(run)["token_kld"].layout.title.text


@installed
def test_llamacpp_rows_combine_over_windows_measured_apart(loaded, tmp_path):
    """quality --ray's cells (measure/window_job.py) carry llama.cpp's rows with their per-position scores against
    its own f16: combined, the rows of one run over both windows."""
    from codeckv.grid import Local, run_grid
    from codeckv.measure.window_job import WindowJob

    job = WindowJob(loaded.info.name, ["llamacpp-q4_0"], windows=2, length=48, prefix=24)
    rows = run_grid(job, tmp_path / "w.csv", Local(1))
    combined = {r.tier: r for r in job.combine(rows, job.reference_windows(loaded.tokenizer), loaded.tokenizer).rows}
    whole = {r.tier: r for r in measure_quality(loaded, [Q4], windows=2, length=48, prefix=24).rows}
    assert list(combined) == ["native", "llamacpp-f16", "llamacpp-q4_0"] == list(whole)
    for tier, want in whole.items():
        got = combined[tier]
        assert (got.reference, got.archive_bytes, got.windows) == (want.reference, want.archive_bytes, 2), tier
        # the bounds of a cache fed alone vs in a batch (tests/measure/test_quality.py, docs/testing.md)
        assert got.kld == pytest.approx(want.kld, rel=1e-4, abs=1e-9), tier
        assert got.top1_pct == pytest.approx(want.top1_pct, abs=100.0 / (2 * 24) + 1e-9), "a near-tie may flip"
        assert got.yardstick.kld["p99"] == pytest.approx(want.yardstick.kld["p99"], rel=1e-4, abs=5e-6), tier


@installed
def test_needle_and_latency_take_llamacpp_types(loaded, tmp_path):
    grid = needle_grid(loaded, [Q8], [300], [0.0])
    assert grid.tiers == ["native", "llamacpp-f16", "llamacpp-q8_0"], "llama.cpp's own f16 answers beside its type"
    assert all(r.answer for r in grid.rows) and grid.rows[-1].ratio_vs_bf16 == pytest.approx(34 / 64)
    out = tmp_path / "latency.csv"
    args = ["latency", "--contexts", "64", "--tiers", "int8", "llamacpp-q4_0", "--tokens", "6", "--threads", "1"]
    assert main([*args, "--out", str(out)]) == 0
    rows = {r["tier"]: r for r in csv.DictReader(out.open())}
    assert set(rows) == {"int8", "llamacpp-f16", "llamacpp-q4_0"}
    assert rows["llamacpp-q4_0"]["engine"] == "llama.cpp" and rows["int8"]["engine"] == "transformers"
    assert float(rows["llamacpp-f16"]["latency_ratio"]) == 1.0 and float(rows["llamacpp-q4_0"]["latency_ratio"]) > 0


def test_without_the_package_each_type_is_one_line(loaded, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    run = measure_quality(loaded, [TIERS["png"], Q4], windows=1, length=16)
    assert [r.tier for r in run.rows] == ["native", "png"]
    assert len(run.absent) == 1 and run.absent[0].startswith("llamacpp-q4_0: absent") and "--llamacpp" in run.absent[0]
    assert run_for("llamacpp-q4_0") is Q4
    assert main(["latency", "--tiers", "llamacpp-q4_0"]) == 2, "without --contexts: a usage error"
    assert "--contexts only" in capsys.readouterr().err
