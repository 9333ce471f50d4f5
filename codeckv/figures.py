"""The figure sets of each view, built in one place for the app and the CLI (plots.py draws each figure).

    figures = sweep_figures(result)       # {"pareto": ..., "latency": ..., "token_match": ..., "token_nll": ...}
    figures = inspect_figures(view)       # {"heatmap_key": ..., "heatmap_value": ..., "spectrum": ..., ...}
"""

from __future__ import annotations

import plotly.graph_objects as go

from codeckv import plots
from codeckv.measure.inspect import Inspection
from codeckv.measure.sweep import Sweep


def worst_tier(result: Sweep) -> str:
    """The swept run with the largest ΔNLL: the one whose per-token chart is shown first."""
    return max(result.comparisons, key=lambda label: result.comparisons[label].delta_nll_pct)


def token_nll_figure(result: Sweep, label: str) -> go.Figure:
    """Per-token NLL difference of one swept run."""
    cmp = result.comparisons[label]
    return plots.token_nll_figure(cmp.token_nll_native, cmp.token_nll_codec, cmp.scored_tokens, label)


def sweep_figures(result: Sweep) -> dict[str, go.Figure]:
    """Storage vs ΔNLL, decode latency, token match, and the per-token NLL of the worst tier."""
    return {
        "pareto": plots.pareto_figure(result.rows),
        "latency": plots.latency_figure(result.rows),
        "token_match": plots.token_match_figure(result.rows),
        "token_nll": token_nll_figure(result, worst_tier(result)),
    }


def inspect_figures(view: Inspection) -> dict[str, go.Figure]:
    """K and V heatmaps of the chosen (layer, head), the DCT spectra, per-layer errors and smoothness."""
    return {
        "heatmap_key": plots.kv_heatmap_figure(view.head, "key", view.tokens),
        "heatmap_value": plots.kv_heatmap_figure(view.head, "value", view.tokens),
        "spectrum": plots.spectrum_figure(view.spectrum),
        "layer_errors": plots.layer_error_figure(view.layers),
        "var_ratio": plots.var_ratio_figure(view.layers),
    }
