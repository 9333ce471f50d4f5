"""Resume against recompute: the saved file, its read / rebuild / first-token times, and a native re-prefill."""

import csv

import pytest

from codeckv.cache import CODES, VIEW
from codeckv.cli import main
from codeckv.measure.resume import resume_table
from codeckv.tiers import TIERS


def test_resume_rows_time_each_step_and_the_cache_on_its_codes_rebuilds_nothing(loaded, tmp_path):
    rows = {r.tier: r for r in resume_table(loaded, [TIERS["turbo-4"], TIERS["png"]], [96], question=8, reps=1,
                                            folder=tmp_path)}
    turbo, png = rows["turbo-4"], rows["png"]
    assert set(turbo.attention) == {CODES} and set(png.attention) == {VIEW}, "resumed as the Chat keeps them"
    for row in rows.values():
        assert row.resume_ms == pytest.approx(row.read_ms + row.rebuild_ms + row.first_token_ms, rel=1e-6)
        assert row.recompute_ms > 0 and row.resume_over_recompute == pytest.approx(row.resume_ms / row.recompute_ms)
        assert (tmp_path / f"{row.tier}-96.kvc").stat().st_size == row.file_bytes
    assert turbo.rebuild_ms < png.rebuild_ms, "no view to rebuild on the codes"
    assert turbo.file_bytes < 0.3 * png.file_bytes and png.file_bytes >= png.native_bytes, "png stores every bit"
    with pytest.raises(ValueError, match="tiers that encode"):
        resume_table(loaded, [TIERS["native"]], [96], folder=tmp_path)


def test_resume_cli_writes_its_table(tmp_path):
    out = tmp_path / "resume.csv"
    args = ["resume", "--contexts", "64", "--tiers", "int8", "--reps", "1", "--files", str(tmp_path / "files")]
    assert main([*args, "--out", str(out)]) == 0
    (row,) = csv.DictReader(out.open())
    assert row["tier"] == "int8" and int(row["file_bytes"]) > 0 and float(row["resume_over_recompute"]) > 0
