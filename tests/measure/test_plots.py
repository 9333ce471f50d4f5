"""Every figure builds from real measurements and serializes to JSON."""

import json

import pytest

from codeckv import plots
from codeckv.measure.inspection import inspect_capture


@pytest.fixture(scope="module")
def view(capture):
    return inspect_capture(capture, "jpeg-k2", layer=1, head=2)


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
    view = inspect_capture(capture, "png", layer=0, head=0)
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


def test_the_tier_per_layer_figure_has_one_bar_series_per_tier(capture):
    from codeckv.measure.inspection import inspect_capture
    from codeckv.schedule import schedule

    view = inspect_capture(capture, schedule("turbo-4", {0: "int8", 1: "int8", 29: "turbo-3"}))
    bars = [trace for trace in plots.layer_tier_figure(view.layers).data if trace.type == "bar"]
    assert sorted(trace.name for trace in bars)[0] == "int8" and len(bars) == 3
    assert {trace.name: list(trace.x) for trace in bars}["int8"] == [0, 1]
