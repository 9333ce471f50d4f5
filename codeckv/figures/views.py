"""The figure sets of each view, built in one place for the app and the CLI (plots.py draws each figure).

    figures = quality_figures(run)        # long text: {"pareto_kld", "pareto_nll", "token_kld"}
    figures = sweep_figures(result)       # one prompt: {"pareto_kld", "latency", "token_match", "token_kld"}
    figures = inspect_figures(view)       # {"heatmap_key", "heatmap_value", "spectrum", "layer_errors", ...}
"""

from __future__ import annotations

import plotly.graph_objects as go

from codeckv.figures import plots
from codeckv.measure.inspection import Inspection
from codeckv.measure.quality import QualityRun
from codeckv.measure.sweep import Sweep


def worst_tier(result: Sweep | QualityRun) -> str:
    """The tier with the largest KL divergence among those with per-token scores (a quality run's llama.cpp rows are
    scored in llama.cpp, against its own f16): the one whose per-token chart is shown first."""
    rows = [r for r in result.rows if r.tier != "native"
            and (not isinstance(result, QualityRun) or r.tier in result.scores)] or result.rows[:1]
    return max(rows, key=lambda r: r.kld).tier


def token_kld_figure(result: Sweep | QualityRun, tier: str) -> go.Figure:
    """Per-token KL divergence of one tier: over the reply (one prompt) or window 0 (long text)."""
    if isinstance(result, QualityRun):
        return plots.token_kld_figure(result.scores[tier].kld[0].tolist(), result.scored_tokens, tier)
    cmp = result.comparisons[tier]
    return plots.token_kld_figure(cmp.token_kld, cmp.scored_tokens, tier)


def quality_figures(run: QualityRun, rows: list[dict] | None = None) -> dict[str, go.Figure]:
    """Storage vs KLD and vs ΔNLL with error bars over windows, and the per-token KLD of the worst tier.

    `rows`: the Pareto charts' points when they are more than this run's (`quality --update`: the merged table).
    """
    row = run.rows[0]
    where = f"{row.windows} × {row.tokens_per_window} tokens of {row.source}"
    points = rows if rows is not None else run.rows
    return {
        "pareto_kld": plots.pareto_figure(points, "kld", title=f"Storage vs KL divergence ({where})"),
        "pareto_nll": plots.pareto_figure(points, "delta_nll_pct", title=f"Storage vs ΔNLL ({where})"),
        "token_kld": token_kld_figure(run, worst_tier(run)),
    }


def sweep_figures(result: Sweep) -> dict[str, go.Figure]:
    """One prompt: storage vs KLD on the reply, decode latency, token match, per-token KLD of the worst tier."""
    return {
        "pareto_kld": plots.pareto_figure(result.rows, "kld", title="Storage vs KL divergence (one reply)"),
        "latency": plots.latency_figure(result.rows),
        "token_match": plots.token_match_figure(result.rows),
        "token_kld": token_kld_figure(result, worst_tier(result)),
    }


def inspect_figures(view: Inspection) -> dict[str, go.Figure]:
    """K and V heatmaps of one (layer, head), the DCT and channel spectra, per-layer errors, tiers, smoothness."""
    return {
        "heatmap_key": plots.kv_heatmap_figure(view.head, "key", view.tokens),
        "heatmap_value": plots.kv_heatmap_figure(view.head, "value", view.tokens),
        "spectrum": plots.spectrum_figure(view.spectrum),
        "channel_spectrum": plots.channel_spectrum_figure(view.channels),
        "layer_errors": plots.layer_error_figure(view.layers),
        "layer_tiers": plots.layer_tier_figure(view.layers),
        "var_ratio": plots.var_ratio_figure(view.layers),
    }
