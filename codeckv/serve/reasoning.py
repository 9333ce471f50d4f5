"""The Reasoning tab's grid: its inputs checked against the choices and the budget, its outputs drawn.

    samples, steps, budget, tiers = reasoning_cells(4, ["3", "4"], 128, ["turbo-3"])   # refused before any model work
    rows = reasoning_request(loaded, 4, ["3", "4"], 128, ["turbo-3", "tova-budget256"], progress=cb)
    accuracy, curve, table, csv_path = reasoning_views(rows, folder, loaded.info.name)

Each problem costs a native prefill of the worked examples and every tier's reply decoded together, one row a tier
plus one for each tier that has left native's path (measure/reasoning.py). The budget bounds the problems times the
reply budget (Limits.max_reasoning_tokens: 8 problems of 256 tokens by default); a GPU Space can raise it.
"""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from codeckv.figures import reasoning_accuracy_figure, reasoning_curve_figure
from codeckv.loaded import LoadedModel
from codeckv.measure.reasoning import as_dicts, reasoning_grid
from codeckv.measure.reasoning_summary import kld_curve, summarize
from codeckv.measure.reasoning_tasks.word_problems import MAX_STEPS, MIN_STEPS
from codeckv.measure.table import write_csv
from codeckv.serve.inputs import chosen_tiers, one_of, whole
from codeckv.serve.limits import Limits, StopFlag
from codeckv.serve.service import Progress, prepared, until

STEP_CHOICES = tuple(str(n) for n in range(MIN_STEPS, MAX_STEPS + 1))
MAX_TAB_SAMPLES = 32
BOUNDARY_CHOICES = ("turbo-3-skip2", "turbo-4-skip2")  # tiers with their first and last 2 layers native (vLLM's rule)
MIN_TAB_BUDGET, MAX_TAB_BUDGET = 32, 512


def reasoning_cells(samples, steps, budget, tiers, limits: Limits | None = None) -> tuple[int, tuple[int, ...], int,
                                                                                       list]:
    """The problems, step counts, reply budget and tiers (none: native alone), checked against the choices and the
    request budget."""
    limits = limits or Limits.from_env()
    tiers = chosen_tiers(tiers, allow_native=False, peers=True, also=BOUNDARY_CHOICES) if tiers else []
    samples = whole(samples, "problems", 1, MAX_TAB_SAMPLES)
    if not isinstance(steps, list | tuple) or not steps:
        raise ValueError(f"choose at least one step count (allowed: {', '.join(STEP_CHOICES)})")
    steps = tuple(sorted({int(one_of(str(n), "steps", STEP_CHOICES)) for n in steps}))
    budget = whole(budget, "reply budget", MIN_TAB_BUDGET, MAX_TAB_BUDGET)
    if samples * budget > limits.max_reasoning_tokens:
        raise ValueError(f"{samples} problems x {budget} tokens = {samples * budget:,} generated tokens a tier, more "
                         f"than the {limits.max_reasoning_tokens:,} allowed per request here: choose fewer")
    return samples, steps, budget, tiers


def reasoning_request(loaded: LoadedModel, samples, steps, budget, tiers, progress: Progress | None = None,
                      limits: Limits | None = None, stop: StopFlag | None = None) -> list[dict]:
    """Native and every chosen tier on `samples` word problems (seed 0), each followed along its own reply."""
    limits = limits or Limits.from_env()
    samples, steps, budget, tiers = reasoning_cells(samples, steps, budget, tiers, limits)
    report = until(limits.deadline(), progress, stop)
    prepared(loaded, tiers, report)
    return as_dicts(reasoning_grid(loaded, tiers, samples, 0, steps, budget, progress=report))


def reasoning_views(rows: list[dict], folder: Path, model: str) -> tuple[go.Figure, go.Figure, dict, str]:
    """The tab's outputs: accuracy against bytes, KLD along the generation (both titled with `model`), the summary
    table and the path of the per-problem CSV in `folder`."""
    path = write_csv(rows, folder / "reasoning-problems.csv")
    summary, curve = summarize(rows), kld_curve(rows)
    headers = ["tier", "problems", "accuracy %", "± se", "agreement %", "lost", "gained", "departed %",
               "first departure", "KLD", "top-1 %", "reply tokens", "stores vs bf16", "seconds"]

    def shown(value, digits):
        return round(value, digits) if value == value else ""

    data = [[s["tier"], s["problems"], shown(s["accuracy"], 1), shown(s["accuracy_se"], 1), shown(s["agreement"], 1),
             s["lost"], s["gained"], shown(s["departed"], 1), shown(s["first_departure"], 1), shown(s["kld"], 4),
             shown(s["top1"], 1), shown(s["answer_tokens"], 1), f"{100 * s['stored_vs_bf16']:.1f}%",
             round(s["seconds"], 1)] for s in summary]
    return (reasoning_accuracy_figure(summary, model), reasoning_curve_figure(curve, model),
            {"headers": headers, "data": data}, str(path))
