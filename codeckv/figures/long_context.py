"""Long-context figures: RULER scores per task (heatmaps), score against bytes, quality against depth, and the
placeholder a long-context chart shows until its grid has run.

    fig = ruler_heatmap_figure(rows)          # measure/ruler.py rows: one panel per task, tiers x lengths
    fig = ruler_bytes_figure(rows, 4096)      # the RULER average against what each tier stores vs bf16
    fig = depth_figure(rows)                  # quality rows at several prefix lengths: KLD per tier vs depth
    fig = placeholder_figure(title, "run ... first")  # a chart's place until its grid has run

Rows may be dataclasses or dicts read back from a CSV (numbers as floats).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from codeckv.figures.plots import CODEC_COLORS, NATIVE_COLOR, _dicts, pareto_figure, themed

SCORE_SCALE = [[0, "#fca5a5"], [0.5, "#fde68a"], [1, "#86efac"]]  # red 0 -> amber 50 -> green 100


def _tiers(rows: list[dict]) -> list[str]:
    """Tier names as met, native first."""
    names = list(dict.fromkeys(r["tier"] for r in rows))
    return sorted(names, key=lambda name: name != "native")


def ruler_heatmap_figure(rows: Sequence, model: str | None = None) -> go.Figure:
    """RULER's score (0-100) per tier and length, one panel per task (measure/ruler.py rows); the title names `model`
    when given."""
    rows = _dicts(rows)
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    tiers, lengths = _tiers(rows), sorted({int(r["length"]) for r in rows})
    columns = min(4, len(tasks))
    fig = make_subplots(rows=-(-len(tasks) // columns), cols=columns, subplot_titles=tasks, shared_yaxes=True,
                        horizontal_spacing=0.03, vertical_spacing=0.08)
    x = [f"{n / 1024:g}k" for n in lengths]
    for index, task in enumerate(tasks):
        score = {(r["tier"], int(r["length"])): r["score"] for r in rows if r["task"] == task}
        z = [[score.get((tier, n)) for n in lengths] for tier in tiers]
        fig.add_trace(go.Heatmap(
            z=z, x=x, y=tiers, zmin=0, zmax=100, colorscale=SCORE_SCALE, showscale=index == 0, xgap=2, ygap=2,
            text=[[f"{v:.0f}" if v is not None else "" for v in line] for line in z], texttemplate="%{text}",
            colorbar=dict(title="score"),
            hovertemplate=f"{task}<br>%{{y}} at %{{x}} tokens<br>score %{{z:.1f}}<extra></extra>",
        ), row=index // columns + 1, col=index % columns + 1)
    fig.update_xaxes(type="category")
    fig.update_yaxes(type="category", autorange="reversed")
    themed(fig, "RULER score per task and length (0-100)" + (f", {model}" if model else ""))
    longest = max(len(t) for t in tiers)  # the tier names label the rows: room for the longest (font 16: ~9 px a char)
    fig.update_layout(height=max(420, 60 + 24 * len(tiers) * -(-len(tasks) // columns)),
                      margin=dict(l=40 + 9 * longest))
    return fig


def ruler_average(rows: Sequence, length: int) -> dict[str, dict]:
    """tier -> a Pareto row of its RULER average at `length` (measure/ruler.py rows): `score` the mean over the tasks,
    `score_se` its standard error (the tasks' samples are drawn apart: the root of the tasks' squared errors over
    their count), `stored_vs_bf16` and `archive_bytes` (what the cache held) the means, `tasks` their count,
    `samples` the fewest samples a task had (0 where the rows do not say). Only
    the tiers measured on every task native was (an average over other tasks would not compare)."""
    by_tier: dict[str, dict[str, dict]] = {}
    for row in _dicts(rows):
        if int(row["length"]) == length:
            by_tier.setdefault(row["tier"], {})[row["task"]] = row
    tasks = sorted(by_tier.get("native", {}))
    averages = {}
    for tier, found in by_tier.items():
        if not tasks or not set(tasks) <= set(found):
            continue
        errors = [float(found[t].get("score_se", math.nan)) for t in tasks]
        averages[tier] = {
            "tier": tier, "tasks": len(tasks), "score": statistics.fmean(float(found[t]["score"]) for t in tasks),
            "score_se": math.sqrt(sum(e * e for e in errors)) / len(tasks),  # nan with one sample: no error bar
            "stored_vs_bf16": statistics.fmean(float(found[t]["stored_vs_bf16"]) for t in tasks),
            "archive_bytes": round(statistics.fmean(float(found[t].get("held_bytes") or 0) for t in tasks)),
            "samples": min(int(float(found[t].get("samples") or 0)) for t in tasks),  # 0: not recorded
        }
    return averages


def ruler_bytes_figure(rows: Sequence, length: int, model: str | None = None) -> go.Figure:
    """The RULER average at `length` against what each tier stores per token seen vs bf16 (ruler_average): the
    Pareto chart of figures/plots.py on its score axis, error bars the average's standard error; the title names
    `model` when given. Where some tiers have fewer samples a task than others, their labels give their count."""
    averages = list(ruler_average(rows, length).values())
    tasks = max((a["tasks"] for a in averages), default=0)
    named = f", {model}" if model else ""
    most = max((a["samples"] for a in averages), default=0)
    fewer = ""
    if any(0 < a["samples"] < most for a in averages):  # a grid grown for some tiers: their counts on the chart
        for a in averages:
            if 0 < a["samples"] < most:
                a["label"] = f"{a['tier']} ({a['samples']})"
        fewer = f"; {most} samples a task, (n): n"
    counted = f"{tasks} task{'s' * (tasks != 1)}{fewer}"
    return pareto_figure(averages, "score", title=f"RULER average at {length:,} tokens ({counted}) vs bytes{named}")


def placeholder_figure(title: str, message: str) -> go.Figure:
    """A chart's place holding a line of text instead: what to run to fill it."""
    fig = go.Figure()
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=16, color=NATIVE_COLOR))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return themed(fig, title)


def depth_figure(rows: Sequence, metric: str = "kld", model: str | None = None) -> go.Figure:
    """A quality metric of the tokens after a compressed prefix, against the prefix's length: one line per tier
    (quality rows of several --depths, each with its prefix_tokens), with the spread over windows as error bars;
    the title names `model` when given."""
    rows = [r for r in _dicts(rows) if r["tier"] != "native"]
    fig = go.Figure()
    for index, tier in enumerate(_tiers(rows)):
        points = sorted((r for r in rows if r["tier"] == tier), key=lambda r: int(r["prefix_tokens"]))
        spread = [r.get(f"{metric}_se") for r in points]
        fig.add_trace(go.Scatter(
            x=[int(r["prefix_tokens"]) for r in points], y=[r[metric] for r in points], name=tier,
            mode="lines+markers", line=dict(color=CODEC_COLORS[index % len(CODEC_COLORS)]),
            error_y=dict(type="data", array=[s if s is not None and math.isfinite(s) else 0 for s in spread]),
        ))
    depths = sorted({int(r["prefix_tokens"]) for r in rows})
    fig.update_xaxes(type="log", tickvals=depths, ticktext=[f"{d / 1024:g}k" for d in depths])
    fig.update_yaxes(type="log")
    label = {"kld": "KLD from native (nats/token)", "delta_nll_pct": "ΔNLL %", "top1_pct": "top-1 agreement %"}
    named = f", {model}" if model else ""
    return themed(fig, f"{label.get(metric, metric)} of the 256 tokens after a compressed context{named}",
                  "context compressed (tokens)", label.get(metric, metric))
