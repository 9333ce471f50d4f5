"""The quality table on a short corpus slice: png is exactly lossless, lossy tiers cost bytes honestly."""

import csv

from codeckv.__main__ import main
from codeckv.measure.corpus import corpus_text, corpus_windows
from codeckv.measure.quality import quality_table


def test_corpus_is_the_python_reference_topics(loaded):
    from pydoc_data.topics import topics

    text = corpus_text()
    assert text.startswith(topics[sorted(topics)[0]]) and text.endswith(topics[sorted(topics)[-1]])
    windows = corpus_windows(loaded.tokenizer, 2, 64)
    assert windows.shape == (2, 64)


def test_png_has_zero_delta_nll_and_lossy_tiers_report_their_bytes(loaded):
    rows = {r.tier: r for r in quality_table(loaded, ["png", "jpeg-k8-int8"], windows=1, length=96)}
    assert set(rows) == {"native", "png", "jpeg-k8-int8"}
    assert rows["png"].delta_nll_pct == 0.0 and rows["png"].nll == rows["native"].nll
    assert rows["png"].archive_bytes == rows["native"].archive_bytes  # fp32 on CPU: the native cache's bytes
    assert rows["jpeg-k8-int8"].ratio_vs_bf16 <= 0.55  # 96 cached tokens: whole blocks, no raw tail
    assert abs(rows["jpeg-k8-int8"].delta_nll_pct) < 5
    assert rows["png"].entropy_coded_bytes < rows["png"].archive_bytes, "zstd finds the lossless saving"
    assert rows["jpeg-k8-int8"].entropy_coded_bytes is None


def test_quality_cli_writes_csv(tmp_path, capsys):
    out = tmp_path / "q.csv"
    assert main(["quality", "--windows", "1", "--length", "48", "--tiers", "png", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["tier"] for r in rows] == ["native", "png"]
    assert "delta_nll_pct" in capsys.readouterr().out


def test_quality_cli_rejects_unknown_tier(capsys):
    assert main(["quality", "--windows", "1", "--length", "48", "--tiers", "nope"]) == 2
    assert "unknown tier 'nope'" in capsys.readouterr().err


def test_memory_cli_compares_the_view_with_materialization_free(tmp_path, capsys):
    out = tmp_path / "m.csv"
    assert main(["memory", "--context", "96", "--decode", "2", "--tiers", "jpeg-k8-int8", "--out", str(out)]) == 0
    rows = {r["mode"]: r for r in csv.DictReader(out.open())}
    assert rows["materialized"]["archive_bytes"] == rows["materialization-free"]["archive_bytes"]
    assert float(rows["materialization-free"]["resident_over_archive"]) < float(
        rows["materialized"]["resident_over_archive"]
    ), "without a decoded view, resident bytes must shrink"
