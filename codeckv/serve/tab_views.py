"""What the Tier sweep, Needle and Memory tabs show of a finished request: charts, tables, and the files to download.

    files = sweep_downloads(outcome, model, folder); views = sweep_views(outcome, "KL divergence", long_context)
    chart = sweep_pareto(outcome.result, "ΔNLL")  # redrawn on another quality axis (service.METRICS)
    heatmap, table, csv_path = needle_views(grid, folder)
    held, peak, table, csv_path = memory_views(rows, folder)

The requests themselves (validation, budgets, measurement) are codeckv/serve/service.py's; the Long context
tab's views are codeckv/serve/long_context.py's, beside its request.
"""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from codeckv.figures import quality_figures, worst_tier
from codeckv.figures.plots import memory_figure, needle_figure, pareto_figure
from codeckv.measure.needle import NeedleGrid
from codeckv.measure.needle import as_dicts as needle_dicts
from codeckv.measure.quality import QualityRun
from codeckv.measure.sweep import Sweep
from codeckv.measure.table import write_csv, write_json
from codeckv.serve.formatting import human_bytes
from codeckv.serve.long_context import long_context_pareto
from codeckv.serve.service import METRICS, SweepOutcome


def memory_views(rows: list[dict], folder: Path) -> tuple[go.Figure, go.Figure, dict, str]:
    """The Memory tab's outputs: held and peak-held charts, the table, and the path of the rows' CSV in folder."""
    headers = ["prompt tokens", "tier", "attention", "held", "× native held", "peak held", "at rest", "archive"]
    data = [[r["context"], r["tier"], r["mode"], human_bytes(r["held_bytes"]), round(r["held_vs_native"], 3),
             human_bytes(r["peak_held_bytes"]), human_bytes(r["at_rest_bytes"]), human_bytes(r["archive_bytes"])]
            for r in rows]
    path = write_csv(rows, folder / "memory.csv")
    return (memory_figure(rows), memory_figure(rows, "peak_held_bytes", "Peak held over the turn"),
            {"headers": headers, "data": data}, str(path))


def needle_views(grid: NeedleGrid, folder: Path) -> tuple[go.Figure, dict, str]:
    """The Needle tab's outputs: the retrieval heatmap, the answers table, and the path of the grid's CSV in folder."""
    path = write_csv(needle_dicts(grid.rows), folder / "needle.csv")
    return needle_figure(grid), needle_table(grid), str(path)


def needle_table(grid: NeedleGrid) -> dict:
    """The grid's answers as a display table."""
    data = [[r.tier, r.tokens, f"{r.depth:.0%}", r.key, "yes" if r.retrieved else "no", r.press_mode, r.answer]
            for r in grid.rows]
    return {"headers": ["tier", "prompt tokens", "depth", "key", "retrieved", "press protocol", "answer"], "data": data}


def sweep_downloads(outcome: SweepOutcome, model: str, folder: Path) -> list[str]:
    """Write a sweep's rows as CSV and JSON (with what was measured) into folder: their paths."""
    return [str(write_csv(outcome.rows, folder / "sweep.csv")),
            str(write_json({"model": model, **outcome.about, "rows": outcome.rows}, folder / "sweep.json"))]


DRAWN = {"kld": "pareto_kld", "delta_nll_pct": "pareto_nll"}  # a loss axis -> its chart among a sweep's figures


def sweep_pareto(result: QualityRun | Sweep | None, metric: str, long_context: dict | None = None) -> go.Figure | None:
    """The Pareto chart of a finished sweep on a quality axis of METRICS (redrawn, not re-run); on the long-context
    axis, the Long context tab's last grid (`long_context`, serve/long_context.py), with or without a sweep."""
    if metric not in METRICS:
        return None
    if METRICS[metric] == "score":
        return long_context_pareto(long_context)
    if result is None:
        return None
    if isinstance(result, QualityRun):
        return quality_figures(result)[DRAWN[METRICS[metric]]]
    return pareto_figure(result.rows, METRICS[metric], title=f"Storage vs {metric} (one reply)")


def sweep_views(outcome: SweepOutcome, metric: str, long_context: dict | None = None) -> dict:
    """What the Tier sweep tab shows of a finished sweep: the Pareto chart on `metric` (a key of METRICS: the chart
    the sweep drew, else redrawn; the long-context axis charts `long_context`, the Long context tab's last
    grid), the one-prompt charts (None on long text), the per-token KLD and the tiers to pick from."""
    prompt_mode = "latency" in outcome.figures
    drawn = DRAWN.get(METRICS.get(metric))
    pareto = outcome.figures.get(drawn) if drawn else None
    return {
        "pareto": pareto if pareto is not None else sweep_pareto(outcome.result, metric, long_context),
        "prompt_mode": prompt_mode,
        "latency": outcome.figures.get("latency"),
        "token_match": outcome.figures.get("token_match"),
        "token_kld": outcome.figures["token_kld"],
        "tiers": [r.tier for r in outcome.result.rows if r.tier != "native"],
        "worst": worst_tier(outcome.result),
    }
