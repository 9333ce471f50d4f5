"""CLI smoke tests: sweep and inspect write CSV, JSON and standalone HTML; quality --update merges its rows."""

import csv
import json

import pytest

from codeckv.cli import main
from codeckv.measure.memory import modes_of
from codeckv.tiers import get_tier


def test_sweep_cli_writes_table_and_charts(tmp_path, capsys):
    code = main(["sweep", "--prompt", "Hi!", "--tokens", "3", "--tiers", "png", "--no-stop", "--out", str(tmp_path)])
    assert code == 0
    assert "png" in capsys.readouterr().out
    rows = json.loads((tmp_path / "sweep.json").read_text())["rows"]
    assert [r["tier"] for r in rows] == ["png"] and rows[0]["psnr_db"] is None, "inf is written as null"
    assert (tmp_path / "sweep.csv").read_text().startswith("tier,")
    html = (tmp_path / "pareto_kld.html").read_text()
    assert 'src="https://cdn.plot.ly' not in html and len(html) > 1_000_000, "plotly.js is embedded (works offline)"


def test_inspect_cli_writes_layers_and_charts(tmp_path):
    code = main(["inspect", "--context", "24", "--tier", "turbo-4", "--layer", "1", "--head", "0",
                 "--out", str(tmp_path)])
    assert code == 0
    summary = json.loads((tmp_path / "inspect.json").read_text())
    assert summary["tier"] == "turbo-4" and len(summary["layers"]) == 30
    assert {p.name for p in tmp_path.glob("*.html")} == {
        "heatmap_key.html", "heatmap_value.html", "spectrum.html", "channel_spectrum.html", "layer_errors.html",
        "var_ratio.html", "layer_tiers.html",
    }


def test_saved_size_cli_measures_rest_file_and_resume(tmp_path, capsys):
    out = tmp_path / "saved.csv"
    code = main(["saved-size", "--context", "64", "--tiers", "int8", "--out", str(out), "--files", str(tmp_path)])
    assert code == 0 and "rest_held_bytes" in capsys.readouterr().out
    row = out.read_text().splitlines()[1].split(",")
    header = out.read_text().splitlines()[0].split(",")
    values = dict(zip(header, row))
    assert values["tier"] == "int8" and values["within_target"] == "True" and values["resume_exact"] == "True"
    assert int(values["rest_held_bytes"]) < int(values["native_bytes"]) < int(values["view_held_bytes"])
    assert (tmp_path / "int8.kvc").stat().st_size == int(values["file_bytes"])


def test_allocate_cli_prints_the_plan_and_writes_its_three_tables(tmp_path, capsys):
    code = main(["allocate", "--budget", "jpeg-k8-int8", "--ladder", "turbo-4", "int8", "--windows", "1", "--length",
                 "40", "--eval-windows", "1", "--eval-length", "40", "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "plan: " in out and "fisher sensitivity of each of 30 layers" in out
    allocation = (tmp_path / "allocation.csv").read_text().splitlines()
    assert allocation[0].startswith("layer,tier,") and len(allocation) == 31
    with (tmp_path / "comparison.csv").open() as f:
        comparison = list(csv.DictReader(f))
    sources = [row["source"] for row in comparison]
    assert sources.count("corpus") == sources.count("docstrings") == 3, "native, uniform and the plan on both texts"
    assert {row["tier"] for row in comparison} == {"native", "jpeg-k8-int8", "allocated"}
    assert len((tmp_path / "sensitivity.csv").read_text().splitlines()) == 61


def test_outputs_default_to_out_never_assets(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["memory", "--contexts", "16", "--new-tokens", "1", "--tiers", "int8", "--modes", "codes"]) == 0
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.csv")] == ["out/memory-smollm2-135m.csv"]
    rows = list(csv.DictReader((tmp_path / "out/memory-smollm2-135m.csv").open()))
    int8_mode = "codes" if "codes" in modes_of(get_tier("int8")) else "view"  # view only where no kernel reads codes
    assert [(r["tier"], r["mode"]) for r in rows] == [("native", "native"), ("int8", int8_mode)], "--modes codes only"
    assert "memory" in capsys.readouterr().err, "the progress bar goes to stderr"


def test_runtime_error_exits_1_with_one_line_and_usage_error_exits_2(capsys):
    assert main(["memory", "--model", "gpt-17"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: unknown model 'gpt-17'") and "Traceback" not in "\n".join(err)
    assert main(["memory", "--contexts", "-3"]) == 2
    assert "argument --contexts: -3 is below 1" in capsys.readouterr().err


def test_offline_flag_switches_the_hub_off(monkeypatch, capsys):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert main(["memory", "--offline", "--model", "nobody-here/no-such-model-codeckv"]) == 1
    assert "offline" in capsys.readouterr().err
    import os

    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_version_and_help_exit_0(capsys):
    import codeckv

    assert main(["--version"]) == 0 and capsys.readouterr().out.strip() == f"codeckv {codeckv.__version__}"
    assert main(["quality", "--help"]) == 0 and "--offline" in capsys.readouterr().out


def test_quality_update_replaces_and_adds_rows_of_the_same_native_run(tmp_path, capsys):
    out = tmp_path / "q.csv"
    small = ["--windows", "1", "--length", "48", "--out", str(out), "--charts", str(tmp_path / "c")]
    assert main(["quality", "--tiers", "int8", "turbo-4", *small]) == 0
    before = {row["tier"]: row for row in csv.DictReader(out.open())}
    assert main(["quality", "--tiers", "png", "int8", "--update", *small]) == 0
    after = {row["tier"]: row for row in csv.DictReader(out.open())}
    assert list(after) == ["native", "png", "int8", "turbo-4"], "every tier in TIERS' order"
    assert after["turbo-4"] == before["turbo-4"] and float(after["png"]["kld"]) == 0.0
    assert float(after["int8"]["kld"]) == pytest.approx(float(before["int8"]["kld"]), rel=1e-3, abs=1e-7)
    assert '"turbo-4"' in (tmp_path / "c" / "pareto_kld.html").read_text(), "the Pareto chart shows the whole table"
    assert main(["quality", "--tiers", "int8", "--update", "--source", "bible", *small]) == 1
    assert "was not measured against this native run" in capsys.readouterr().err
    assert list(csv.DictReader(out.open()))[3]["tier"] == "turbo-4", "a refused update leaves the CSV as it was"


def test_ruler_cli_writes_rulers_columns_and_update_measures_only_what_is_missing(tmp_path, capsys):
    out = tmp_path / "ruler.csv"
    small = ["ruler", "--lengths", "512", "--tasks", "niah_single_1", "--samples", "1", "--out", str(out),
             "--charts", str(tmp_path / "charts")]
    assert main([*small, "--tiers", "int8"]) == 0
    assert "RULER average" in capsys.readouterr().out
    assert {p.name for p in (tmp_path / "charts").glob("*.html")} == {"ruler_scores.html", "ruler_bytes_512.html"}
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:7] == ["task", "length", "tier", "samples", "score", "score_se", "seconds"]
    assert [r["tier"] for r in rows] == ["int8", "native"]
    assert main([*small, "--tiers", "int8", "turbo-4", "--update"]) == 0
    with out.open() as f:
        assert [r["tier"] for r in csv.DictReader(f)] == ["int8", "native", "turbo-4"]
    with out.with_name("ruler-samples.csv").open() as f:
        assert [(r["sample"], r["tier"]) for r in csv.DictReader(f)] == [("0", "int8"), ("0", "native"),
                                                                          ("0", "turbo-4")]
    assert main([*small, "--tiers", "int8", "--update", "--seed", "7"]) == 1  # other samples: refused
    assert "measured with seed 0, not 7" in capsys.readouterr().err


def test_quality_at_depths_writes_a_row_per_tier_and_depth_and_a_chart_per_metric(tmp_path, capsys):
    out = tmp_path / "depth.csv"
    code = main(["quality", "--depths", "48", "96", "--windows", "1", "--tiers", "snapkv-50", "--out", str(out),
                 "--charts", str(tmp_path / "charts")])  # a press: its scored tokens go in one forward (seconds)
    assert code == 0 and "prefilled once" in capsys.readouterr().out
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["prefix_tokens"], r["tier"]) for r in rows] == [
        ("48", "native"), ("48", "snapkv-50"), ("96", "native"), ("96", "snapkv-50")]
    assert {p.name for p in (tmp_path / "charts").glob("*.html")} == {
        "depth_kld.html", "depth_top1_pct.html", "depth_delta_nll_pct.html"}
    assert main(["quality", "--depths", "48", "--tiers", "hf-quanto-int4"]) == 1  # peers need their own prefill
    assert main(["quality", "--depths", "1000000", "--tiers", "int8"]) == 1  # past the model's context
    assert "more than smollm2-135m's context" in capsys.readouterr().err


def test_quality_at_depths_resumes_a_cut_csv_with_the_rows_it_lacked(tmp_path, capsys):
    from codeckv.corpus import text_digest
    from codeckv.grid.runner import kept_rows, write_rows
    from codeckv.measure.depth_job import DepthJob

    out = tmp_path / "depth.csv"
    small = ["quality", "--depths", "48", "96", "--windows", "1", "--tiers", "snapkv-50", "--out", str(out),
             "--charts", str(tmp_path / "charts")]
    assert main(small) == 0
    whole = out.read_text().splitlines()
    out.write_text("\n".join(whole[:3]) + "\n" + whole[3][:40])  # killed while appending depth 96's rows
    assert main([*small, "--update"]) == 0
    assert out.read_text().splitlines() == whole, "depth 96 measured again, to the same rows; depth 48 kept"
    assert main([*small, "--update", "--windows", "2"]) == 1
    assert "measured with windows 1, not 2" in capsys.readouterr().err
    with out.open() as f:
        kept = list(csv.DictReader(f))
    grown = DepthJob("smollm2-135m", ["snapkv-50", "int8"], depths=[48, 96, 144], windows=1)
    assert grown.cells(kept[:-1]) == [{"prefix_tokens": 48, "tiers": ["int8"]},
                                      {"prefix_tokens": 96, "tiers": ["snapkv-50", "int8"]},
                                      {"prefix_tokens": 144, "tiers": ["native", "snapkv-50", "int8"]}], \
        "--update measures the tiers and depths a CSV lacks, and a depth's rows a kill cut short"
    assert {row["text_digest"] for row in kept} == {""}, "a named source: its name says which text"
    texts = tmp_path / "texts.csv"
    write_rows([{**kept[0], "source": "text", "text_digest": text_digest("one file")}], texts)
    with pytest.raises(ValueError, match="measured with text_digest"):
        kept_rows(DepthJob("smollm2-135m", ["snapkv-50"], [48], 1, "text", "another file"), texts, update=True)
    assert main(["quality", "--ray", "--shared-prefill", "--tiers", "int8"]) == 1  # windows on the grid: lockstep
    assert "--ray feeds each window in lockstep" in capsys.readouterr().err


def test_a_length_past_the_context_is_refused_before_the_model_loads(monkeypatch, capsys):
    import codeckv.models

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the lengths were checked")

    monkeypatch.setattr(codeckv.models, "load_model", no_load)
    assert main(["ruler", "--lengths", "8193", "--samples", "1"]) == 1
    assert "length 8193 is outside 256..8192, the context smollm2-135m takes" in capsys.readouterr().err
    assert main(["ruler", "--lengths", "512", "--tasks", "niah_single_1", "vt", "--samples", "1"]) == 1
    assert "vt needs at least" in capsys.readouterr().err, "too short for a task: the tokenizer says so"
    assert main(["quality", "--depths", "8000", "--tiers", "int8"]) == 1
    assert "8257 tokens a window, more than smollm2-135m's context of 8192" in capsys.readouterr().err
    assert main(["needle", "--lengths", "8180", "--tiers", "int8"]) == 1
    assert "length 8180 + 16 answer tokens exceeds smollm2-135m's context of 8192" in capsys.readouterr().err
