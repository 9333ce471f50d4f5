"""The Long context tab's RULER grid: its inputs checked against the choices and the budget, its outputs drawn.

    tasks, lengths, samples = ruler_cells(["niah_single_1"], ["4096"], 2)      # refused before a model is touched
    rows = ruler_request(loaded, ["niah_single_1"], ["4096"], 2, ["turbo-4", "snapkv-50"], progress=cb)
    heatmap, bytes_chart, table, csv_path, grid = ruler_views(rows, folder, loaded.info.name)
    chart = long_context_pareto(grid)   # the Tier sweep's long-context axis

A grid costs a native prefill per sample, task and length (measure/ruler.py): the budget bounds the prompt tokens
of all of them together (Limits.max_ruler_tokens: 4k x 2 samples x 4 tasks by default, what a 2-vCPU Space runs in
its request time); a GPU Space can raise it. The pass-key grid beside it stays in service.py (needle_request).
"""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from codeckv.figures import ruler_bytes_figure, ruler_heatmap_figure
from codeckv.figures.long_context import placeholder_figure
from codeckv.loaded import LoadedModel
from codeckv.measure.long_tasks import TASK_NAMES
from codeckv.measure.ruler import as_dicts, ruler_grid, task_line
from codeckv.measure.table import write_csv
from codeckv.presses import PRESS_MODES
from codeckv.serve.inputs import chosen_tiers, one_of, whole
from codeckv.serve.limits import Limits, StopFlag
from codeckv.serve.service import Progress, prepared, until

RULER_LENGTHS = (1024, 2048, 4096, 8192, 16384)
RULER_TASKS = TASK_NAMES
MAX_TAB_SAMPLES = 16


def ruler_cells(tasks, lengths, samples, limits: Limits | None = None,
                press_mode: str = "once") -> tuple[list[str], list[int], int]:
    """The chosen tasks, lengths (tokens) and samples, checked against the choices and the budget."""
    limits = limits or Limits.from_env()
    one_of(press_mode, "press protocol", PRESS_MODES)
    if not isinstance(tasks, list | tuple) or not tasks or not isinstance(lengths, list | tuple) or not lengths:
        raise ValueError("choose at least one task and one length")
    tasks = [one_of(t, "task", RULER_TASKS) for t in dict.fromkeys(tasks)]
    lengths = sorted({int(one_of(str(n), "length", map(str, RULER_LENGTHS))) for n in lengths})
    samples = whole(samples, "samples", 1, MAX_TAB_SAMPLES)
    tokens = sum(lengths) * len(tasks) * samples
    if tokens > limits.max_ruler_tokens:
        raise ValueError(f"{len(tasks)} tasks x {samples} samples x {sum(lengths):,} tokens = {tokens:,} prompt "
                         f"tokens, more than the {limits.max_ruler_tokens:,} allowed per request here: choose fewer")
    return tasks, lengths, samples


def ruler_request(loaded: LoadedModel, tasks, lengths, samples, tiers, progress: Progress | None = None,
                  limits: Limits | None = None, stop: StopFlag | None = None, press_mode: str = "once") -> list[dict]:
    """Native and every chosen tier on the chosen RULER tasks and lengths, one native prefill per sample."""
    limits = limits or Limits.from_env()
    tasks, lengths, samples = ruler_cells(tasks, lengths, samples, limits, press_mode)
    if max(lengths) > loaded.info.max_context:
        raise ValueError(f"{max(lengths):,} tokens is more than {loaded.info.name} takes "
                         f"({loaded.info.max_context:,}): choose shorter lengths or another model")
    tiers = chosen_tiers(tiers, allow_native=False, peers=True) if tiers else []
    report = until(limits.deadline(), progress, stop)
    prepared(loaded, tiers, report)
    return as_dicts(ruler_grid(loaded, tiers, tasks, lengths, samples, press_mode=press_mode, progress=report))


def long_context_pareto(grid: dict | None) -> go.Figure:
    """The Tier sweep's Pareto chart on its long-context axis: the RULER average of the Long context tab's last grid
    (`grid`: {"model": name, "rows": ruler rows}, as run_ruler keeps it) at its longest length, against bytes; until
    a grid has run, a line saying so."""
    rows = grid.get("rows") if isinstance(grid, dict) else None
    if not rows:
        return placeholder_figure("Storage vs long-context score",
                                  "No long-context grid yet: run one in the Long context tab, and its RULER average "
                                  "is this axis")
    return ruler_bytes_figure(rows, max(int(r["length"]) for r in rows), str(grid.get("model", "")) or None)


def ruler_views(rows: list[dict], folder: Path, model: str) -> tuple[go.Figure, go.Figure, dict, str, dict]:
    """The tab's outputs: the score heatmap per task, the average against bytes at the longest length (both titled
    with `model`), the table, the path of the grid's CSV in `folder`, and the grid as the Tier sweep's long-context
    axis reads it (long_context_pareto)."""
    path = write_csv(rows, folder / "ruler.csv")
    longest = max(int(r["length"]) for r in rows)
    headers = ["task", "tests", "length", "tier", "samples", "score", "± se", "stores vs bf16", "press protocol",
               "seconds"]
    data = [[r["task"], task_line(r["task"]), r["length"], r["tier"], r["samples"], round(r["score"], 1),
             round(r["score_se"], 1) if r["score_se"] == r["score_se"] else "", f"{100 * r['stored_vs_bf16']:.1f}%",
             r["press_mode"], round(r["seconds"], 1)] for r in rows]
    table = {"headers": headers, "data": data}
    grid = {"model": model, "rows": rows}
    return ruler_heatmap_figure(rows, model), ruler_bytes_figure(rows, longest, model), table, str(path), grid
