"""Every figure builds from real measurements, serializes to JSON and, drawn by Chromium at the app's sizes,
has no clipped or overlapping titles, legends or labels (tests/figure_layout.py)."""

import csv
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from codeckv.figures import plots
from codeckv.measure.inspection import inspect_capture
from codeckv.measure.needle import NeedleGrid, NeedleRow
from codeckv.measure.peers import PEERS
from codeckv.tiers import TIERS
from tests.figure_layout import CHROMIUM, FLAGS, figure_layout_problems

ASSETS = Path(__file__).resolve().parents[2] / "assets"
FULL, HALF = 1330, 650  # the width of a full-row and a half-row gr.Plot at the browser test's 1400 px viewport


@pytest.fixture(scope="module")
def view(capture):
    return inspect_capture(capture, TIERS["jpeg-k2"], layer=1, head=2)


def _figures(swept, view):
    result, _ = swept
    cmp = result.comparisons["jpeg-k2"]
    return {
        "pareto": plots.pareto_figure(result.rows),
        "pareto_kld": plots.pareto_figure(result.rows, "kld"),
        "latency": plots.latency_figure(result.rows),
        "token_match": plots.token_match_figure(result.rows),
        "heatmap_key": plots.kv_heatmap_figure(view.head, "key", view.tokens),
        "heatmap_value": plots.kv_heatmap_figure(view.head, "value"),
        "spectrum": plots.spectrum_figure(view.spectrum),
        "layer_errors": plots.layer_error_figure(view.layers),
        "token_kld": plots.token_kld_figure(cmp.token_kld, cmp.scored_tokens, cmp.tier),
        "var_ratio": plots.var_ratio_figure(view.layers),
        "layer_tiers": plots.layer_tier_figure(view.layers),
    }


def test_every_figure_builds_and_serializes(swept, view):
    for name, fig in _figures(swept, view).items():
        payload = json.loads(fig.to_json())
        assert payload["data"], f"{name} has no traces"
        assert payload["layout"]["title"]["text"], f"{name} has no title"


def test_heatmap_shares_one_colour_scale_for_original_and_reconstruction(view):
    fig = plots.kv_heatmap_figure(view.head, "key")
    assert [t.coloraxis for t in fig.data] == ["coloraxis", "coloraxis", "coloraxis2"]
    assert fig.layout.coloraxis.cmin == -fig.layout.coloraxis.cmax


def test_png_heatmap_and_lossless_psnr_build(capture):
    view = inspect_capture(capture, TIERS["png"], layer=0, head=0)
    json.loads(plots.layer_error_figure(view.layers).to_json())  # infinite PSNR is left out, not serialized
    json.loads(plots.kv_heatmap_figure(view.head, "value").to_json())


def test_pareto_front_keeps_only_undominated_points():
    points = [(0.5, 1.0), (0.25, 5.0), (0.6, 2.0), (1.0, 0.0), (0.25, 6.0)]
    assert plots.pareto_front(points) == [1, 0, 3]


def test_pareto_draws_error_bars_from_the_standard_errors():
    rows = [{"tier": "a", "ratio_vs_bf16": 0.3, "archive_bytes": 10, "kld": 0.01, "kld_se": 0.002},
            {"tier": "b", "ratio_vs_bf16": 0.5, "archive_bytes": 20, "kld": 0.004, "kld_se": 0.001}]
    points = plots.pareto_figure(rows, "kld").data[1]
    assert list(points.error_y.array) == [0.002, 0.001] and points.error_y.visible
    with pytest.raises(ValueError, match="allowed: kld, delta_nll_pct"):
        plots.pareto_figure(rows, "psnr")


def test_a_press_sits_left_of_native_at_the_share_it_keeps():
    """The x axis counts every family alike (stored_vs_bf16): an fp32 native run is a bf16 cache at 1.0, a press
    alone the share it keeps, even where the run held its kept tokens in fp32 (ratio_vs_bf16 1.2)."""
    rows = [{"tier": "native", "ratio_vs_bf16": 2.0, "steady_state_ratio": 2.0, "archive_bytes": 40, "kld": 0.0},
            {"tier": "snapkv-50", "ratio_vs_bf16": 1.2, "steady_state_ratio": math.nan, "stored_vs_bf16": 0.6,
             "archive_bytes": 24, "kld": 0.01}]
    figure = plots.pareto_figure(rows, "kld")
    x = {name: value for trace in figure.data[1:] for name, value in zip(trace.text, trace.x)}
    assert x == {"native": 1.0, "snapkv-50": 0.6}
    assert "per token seen" in figure.layout.xaxis.title.text


def _csv_rows(name: str) -> list[dict]:
    """A committed measurement's rows, numbers as numbers."""
    def value(text: str):
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return {"True": True, "False": False}.get(text, text)

    with (ASSETS / name).open() as f:
        return [{key: value(text) for key, text in row.items()} for row in csv.DictReader(f)]


def _needle_grid() -> NeedleGrid:
    rows = [NeedleRow(**row) for row in _csv_rows("needle-smollm2-135m.csv")]
    tiers = list(dict.fromkeys(r.tier for r in rows))
    return NeedleGrid(rows, tiers, sorted({r.length for r in rows}), sorted({r.depth for r in rows}))


def _drawn_figures(swept, view) -> dict[str, tuple]:
    """Every figure the app draws, with the width of its place in the app (inspect's halves are HALF)."""
    quality = _csv_rows("quality-smollm2-135m.csv")  # every tier and the peers, from one command
    assert any(row["tier"] in PEERS for row in quality)
    where = "4 × 512 tokens of corpus"  # the titles quality_figures gives them
    layers = view.channels.key_share.shape[0]
    with_bits = dataclasses.replace(view.channels, bits={i: torch.linspace(8, 0, 150) for i in range(layers)})
    half = {"spectrum", "layer_errors", "var_ratio"}
    figures = {name: (fig, HALF if name in half else FULL) for name, fig in _figures(swept, view).items()}
    return {
        **figures,
        "channel_spectrum": (plots.channel_spectrum_figure(view.channels), HALF),
        "channel_spectrum_pca": (plots.channel_spectrum_figure(with_bits), HALF),  # the PCA tiers' bits panel
        "pareto_quality_kld": (plots.pareto_figure(quality, "kld", title=f"Storage vs KL divergence ({where})"), FULL),
        "pareto_quality_nll": (plots.pareto_figure(quality, "delta_nll_pct", title=f"Storage vs ΔNLL ({where})"), FULL),
        "needle": (plots.needle_figure(_needle_grid()), FULL),
        "memory": (plots.memory_figure(_csv_rows("memory-smollm2-135m.csv")), HALF),
    }


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (scripts/setup.sh --dev)")
def test_every_figure_reads_cleanly_at_the_apps_sizes(swept, view):
    sync_api = pytest.importorskip("playwright.sync_api")
    plotly_js = (Path(plots.go.__file__).parents[1] / "package_data" / "plotly.min.js").read_text()
    problems = {}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_content(f"<html><body><script>{plotly_js}</script></body></html>")
        for name, (fig, width) in _drawn_figures(swept, view).items():
            page.evaluate("""([figure, width]) => {
                document.querySelectorAll('body > div').forEach((old) => old.remove());
                const div = document.createElement('div');
                div.style.width = width + 'px';
                document.body.appendChild(div);
                return Plotly.newPlot(div, figure.data, figure.layout);
            }""", [json.loads(fig.to_json()), width])
            assert page.locator(".js-plotly-plot").count() == 1, f"{name} was not drawn"
            problems[name] = figure_layout_problems(page)
        browser.close()
    assert not any(problems.values()), {name: found for name, found in problems.items() if found}


def test_the_tier_per_layer_figure_has_one_bar_series_per_tier(capture):
    from codeckv.cache.schedule import schedule
    from codeckv.measure.inspection import inspect_capture

    view = inspect_capture(capture, schedule("turbo-4", {0: "int8", 1: "int8", 29: "turbo-3"}))
    bars = [trace for trace in plots.layer_tier_figure(view.layers).data if trace.type == "bar"]
    assert sorted(trace.name for trace in bars)[0] == "int8" and len(bars) == 3
    assert {trace.name: list(trace.x) for trace in bars}["int8"] == [0, 1]


def test_the_pareto_chart_tells_every_family_apart_by_marker_and_colour():
    names = ["native", "turbo-4", "int8", "fp8-e4m3", "nvfp4", "vllm-tq-k8v4", "vllm-tq-3bit-nc-skip0", "snapkv-50",
             "tova-75", "snapkv-50+turbo-4", "hf-quanto-int4", "llamacpp-q4_0"]
    rows = [{"tier": name, "ratio_vs_bf16": 0.1 + 0.05 * i, "kld": 0.01 * i, "kld_se": 0.001, "archive_bytes": 1000}
            for i, name in enumerate(names)]
    fig = plots.pareto_figure(rows, "kld")
    traces = {trace.name: trace for trace in fig.data if trace.mode == "markers"}
    assert list(traces) == list(plots.FAMILIES)
    assert list(traces[plots.PRESS_CODEC_FAMILY].text) == ["snapkv-50+turbo-4"]
    assert list(traces[plots.FORMAT_FAMILY].text) == ["fp8-e4m3", "nvfp4"]
    assert list(traces[plots.VLLM_FAMILY].text) == ["vllm-tq-k8v4", "vllm-tq-3bit-nc-skip0"], "FP8 keys: still vLLM's"
    looks = {(str(t.marker.symbol), str(t.marker.color)) for name, t in traces.items() if name != plots.CODEC_FAMILY}
    assert len(looks) == len(traces) - 1, "each family its own marker and colour"


def test_the_long_context_figures_draw_every_tier_measured():
    from codeckv.figures import depth_figure, ruler_bytes_figure, ruler_heatmap_figure

    rows = [{"task": task, "length": length, "tier": tier, "score": score, "stored_vs_bf16": stored}
            for task in ("niah_single_1", "vt") for length in (2048, 4096)
            for tier, score, stored in (("native", 100.0, 1.0), ("turbo-4", 90.0, 0.297), ("snapkv-50", 0.0, 0.5))]
    heatmap = ruler_heatmap_figure(rows, "smollm2-135m")
    assert heatmap.layout.title.text.endswith(", smollm2-135m")
    assert len(heatmap.data) == 2 and list(heatmap.data[0].y) == ["native", "turbo-4", "snapkv-50"]
    assert list(heatmap.data[0].z[1]) == [90.0, 90.0]
    chart = ruler_bytes_figure(rows, 4096, "smollm2-135m")
    assert chart.layout.title.text.endswith("vs bytes, smollm2-135m")
    by_name = {name: (x, y) for trace in chart.data if trace.mode == "markers"
               for name, x, y in zip(trace.text, trace.x, trace.y)}
    assert by_name == {"native": (1.0, 100.0), "turbo-4": (0.297, 90.0), "snapkv-50": (0.5, 0.0)}
    front = next(trace for trace in chart.data if trace.name == "Pareto front")
    assert list(front.x) == [0.297, 1.0], "a score's front: higher is better (snapkv-50 stores more, scores less)"
    depth_rows = [{"tier": tier, "prefix_tokens": depth, "kld": kld, "kld_se": 0.001}
                  for tier, kld in (("native", 0.0), ("turbo-4", 0.005)) for depth in (1024, 4096)]
    depth = depth_figure(depth_rows, model="smollm2-135m")
    assert [trace.name for trace in depth.data] == ["turbo-4"] and list(depth.data[0].x) == [1024, 4096]
    assert depth.layout.title.text.endswith("after a compressed context, smollm2-135m")


def test_the_ruler_average_carries_its_standard_error_over_tasks():
    from codeckv.figures.long_context import ruler_average

    rows = [{"task": task, "length": 4096, "tier": tier, "score": score, "score_se": se, "stored_vs_bf16": 0.3,
             "held_bytes": held}
            for task, se in (("vt", 3.0), ("cwe", 4.0))
            for tier, score, held in (("native", 80.0, 1000), ("turbo-4", 60.0, 300))]
    rows.append({"task": "vt", "length": 4096, "tier": "int8", "score": 50.0, "score_se": 1.0,
                 "stored_vs_bf16": 0.56, "held_bytes": 560})  # one task of two: no average that compares
    averages = ruler_average(rows, 4096)
    assert set(averages) == {"native", "turbo-4"}
    assert averages["turbo-4"]["score"] == 60.0 and averages["turbo-4"]["archive_bytes"] == 300
    assert averages["turbo-4"]["score_se"] == pytest.approx(2.5), "sqrt(3^2 + 4^2) / 2 tasks"
    chart = plots.pareto_figure(list(averages.values()), "score")
    bars = {name: err for trace in chart.data if trace.mode == "markers"
            for name, err in zip(trace.text, trace.error_y.array)}
    assert bars == {"native": pytest.approx(2.5), "turbo-4": pytest.approx(2.5)}
    assert list(chart.layout.yaxis.range) == [-8.0, 108.0], "a score keeps its 0-100 axis"


def test_a_ruler_chart_of_tiers_grown_apart_labels_the_ones_with_fewer_samples():
    from codeckv.figures import ruler_bytes_figure

    rows = [{"task": "vt", "length": 4096, "tier": tier, "score": 50.0, "score_se": 5.0, "stored_vs_bf16": stored,
             "samples": samples} for tier, stored, samples in (("native", 1.0, 8), ("turbo-4", 0.297, 8),
                                                               ("pca-8x", 0.124, 2))]
    chart = ruler_bytes_figure(rows, 4096)
    labels = {annotation.text for annotation in chart.layout.annotations}
    assert {"native", "turbo-4", "pca-8x (2)"} <= labels, labels
    assert "8 samples a task, (n): n" in chart.layout.title.text
    same = ruler_bytes_figure([{**row, "samples": 8} for row in rows], 4096)
    assert "pca-8x" in {a.text for a in same.layout.annotations} and "samples" not in same.layout.title.text
