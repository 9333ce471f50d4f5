"""Reasoning figures: accuracy on word problems against bytes, and KLD along the generation.

    fig = reasoning_accuracy_figure(summary)    # measure/reasoning_summary.py summarize(): the Pareto chart
    fig = reasoning_curve_figure(curve)         # kld_curve(): KLD per 32-token span of each tier's own generation

Rows may be dicts from the measurement or read back from a CSV (numbers as floats).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.colors import qualitative

from codeckv.figures.plots import _dicts, pareto_figure, themed

LINE_COLORS = qualitative.Dark24  # one colour a tier, up to 24 of them


def reasoning_accuracy_figure(summary: Sequence, model: str | None = None) -> go.Figure:
    """lm-eval's strict-match accuracy per tier against what it stores per token vs bf16, error bars its standard
    error over the problems; the title names `model` when given."""
    rows = [{**row, "archive_bytes": row.get("held_bytes")} for row in _dicts(summary)]
    counts = sorted({int(r["problems"]) for r in rows})
    each = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    named = f", {model}" if model else ""
    return pareto_figure(rows, "accuracy", title=f"Word problems solved ({each} each) vs bytes{named}")


def reasoning_curve_figure(curve: Sequence, model: str | None = None, metric: str = "kld") -> go.Figure:
    """`metric` ("kld" or "top1") along the generation: one line per tier (native's, 0, left out), a point per
    32-token span at its middle, error bars the standard error over the problems that reached the span."""
    rows = [r for r in _dicts(curve) if r["tier"] != "native" and math.isfinite(float(r[metric]))]
    fig = go.Figure()
    for index, tier in enumerate(dict.fromkeys(r["tier"] for r in rows)):
        points = sorted((r for r in rows if r["tier"] == tier), key=lambda r: int(r["from"]))
        errors = [float(r[f"{metric}_se"]) for r in points]
        fig.add_trace(go.Scatter(
            x=[(int(r["from"]) + int(r["to"])) / 2 for r in points], y=[float(r[metric]) for r in points], name=tier,
            mode="lines+markers", line=dict(color=LINE_COLORS[index % len(LINE_COLORS)]),
            customdata=[[int(r["from"]), int(r["to"]), int(r["problems"])] for r in points],
            hovertemplate=f"{tier}<br>tokens %{{customdata[0]}}-%{{customdata[1]}} (%{{customdata[2]}} problems)"
                          "<br>%{y:.4g}<extra></extra>",
            error_y=dict(type="data", array=[e if math.isfinite(e) else 0 for e in errors]),
        ))
    label = {"kld": "KLD from native (nats/token)", "top1": "top-1 agreement %"}[metric]
    if metric == "kld":
        fig.update_yaxes(type="log", dtick=1, exponentformat="e")  # a label a decade: none crowd
    named = f", {model}" if model else ""
    return themed(fig, f"{label} along each tier's own generation{named}", "generated token", label)
