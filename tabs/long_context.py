"""The Long context tab: RULER's synthetic tasks and the pass-key grid, native beside every chosen tier.

    with gr.Blocks():
        stops = tabs.long_context.build(model_name, stop_flag, choices, ruler_state, sweep)   # inside the app's Blocks

run_ruler keeps its grid in `ruler_state`, the Tier sweep's long-context axis (the sweep's Pareto chart is redrawn
from it: `sweep` = that tab's state, axis and chart). Inputs are checked before a model is touched
(codeckv/serve/long_context.py, service.needle_cells).
"""

from __future__ import annotations

import gradio as gr

from codeckv.presses import PRESS_MODE_MEANING, PRESS_MODES
from codeckv.serve.guard import guarded
from codeckv.serve.long_context import RULER_LENGTHS, RULER_TASKS, ruler_cells, ruler_request, ruler_views
from codeckv.serve.pool import leased
from codeckv.serve.reports import Reports
from codeckv.serve.service import (
    LONG_GPU_SECONDS,
    NEEDLE_DEPTHS,
    NEEDLE_LENGTHS,
    bar_progress,
    fresh_stop,
    needle_cells,
    needle_request,
)
from codeckv.serve.tab_views import needle_views, sweep_pareto
from codeckv.serve.zerogpu import gpu

REPORTS = Reports(keep=16, prefix="codeckv-long-context-")


@gpu(duration=LONG_GPU_SECONDS)
@guarded
def run_needle(lengths, depths, tiers, model_name, press_mode="once", stop=None, progress=gr.Progress()):  # noqa: B008
    """Pass-key retrieval of native and every chosen tier over prompt lengths and key depths."""
    needle_cells(lengths, depths, press_mode=press_mode)  # refused before a model is touched
    with leased(model_name) as loaded:
        grid = needle_request(loaded, lengths, depths, tiers, bar_progress(progress), stop=fresh_stop(stop),
                              press_mode=press_mode)
    return needle_views(grid, REPORTS.fresh())


@gpu(duration=LONG_GPU_SECONDS)
@guarded
def run_ruler(tasks, lengths, samples, tiers, model_name, press_mode="once", stop=None, progress=gr.Progress()):  # noqa: B008
    """RULER-style tasks: native and every chosen tier, one native prefill per sample (the grid kept for the sweep)."""
    ruler_cells(tasks, lengths, samples, press_mode=press_mode)  # refused before a model is touched
    with leased(model_name) as loaded:
        rows = ruler_request(loaded, tasks, lengths, samples, tiers, bar_progress(progress), stop=fresh_stop(stop),
                             press_mode=press_mode)
        return ruler_views(rows, REPORTS.fresh(), loaded.info.name)


def build(model_name: gr.Dropdown, stop_flag: gr.State, choices: list[str], ruler_state: gr.State,
          sweep: tuple[gr.State, gr.Radio, gr.Plot]) -> list[gr.Button]:
    """The tab's layout and events; its Stop buttons (the app wires every Stop to the session's flag)."""
    with gr.Tab("Long context"):
        gr.Markdown("RULER's synthetic tasks (needles, variable tracking, word counts), generated here from a seed: "
                    "each sample's context is prefilled natively once and every tier's cache built from it (codecs "
                    "convert it, presses evict from it, kvpress's protocol); score = share of the expected strings "
                    "in the greedy answer. `python -m codeckv ruler` runs the full grid.")
        with gr.Row():
            ruler_tasks = gr.CheckboxGroup(list(RULER_TASKS), value=["niah_single_1", "niah_single_2"],
                                           label="tasks", elem_id="ruler-tasks")
            ruler_lengths = gr.CheckboxGroup(list(RULER_LENGTHS), value=[4096], label="tokens", elem_id="ruler-lengths")
            ruler_samples = gr.Slider(1, 16, value=2, step=1, label="samples per task and length")
        ruler_tiers = gr.CheckboxGroup(choices, value=["turbo-4", "snapkv-50"], label="tiers and peers (beside native)")
        with gr.Row():
            ruler_button = gr.Button("Run RULER tasks", variant="primary", scale=4)
            ruler_stop = gr.Button("Stop", scale=1)
        ruler_heatmap = gr.Plot(label="score per task")
        ruler_bytes = gr.Plot(label="score vs bytes")
        ruler_table = gr.Dataframe(label="scores", interactive=False, elem_id="ruler-results")
        ruler_csv = gr.File(label="download CSV")
        gr.Markdown("**Pass key**: a 5-digit key hidden in filler text at several depths and lengths: does the greedy "
                    "answer still contain it? Native runs once per cell; every tier answers from the same prompt.")
        with gr.Row():
            needle_lengths = gr.CheckboxGroup(list(NEEDLE_LENGTHS), value=list(NEEDLE_LENGTHS[:3]),
                                              label="prompt tokens")
            needle_depths = gr.CheckboxGroup(list(NEEDLE_DEPTHS), value=["0%", "50%", "100%"], label="depth of the key")
        needle_tiers = gr.CheckboxGroup(choices, value=["turbo-4", "jpeg-k2"], label="tiers and peers (beside native)")
        needle_protocol = gr.Radio(list(PRESS_MODES), value="once", label="press protocol (both grids)", info="; ".join(
            f"{mode}: {meaning}" for mode, meaning in PRESS_MODE_MEANING.items()))
        with gr.Row():
            needle_button = gr.Button("Run needle test", variant="primary", scale=4)
            needle_stop = gr.Button("Stop", scale=1)
        needle_plot = gr.Plot(label="retrieved")
        needle_answers = gr.Dataframe(label="answers", interactive=False, elem_id="needle-results")
        needle_csv = gr.File(label="download CSV")
    needle_button.click(run_needle, [needle_lengths, needle_depths, needle_tiers, model_name, needle_protocol,
                                     stop_flag],
                        [needle_plot, needle_answers, needle_csv], api_name="needle")
    sweep_state, sweep_metric, pareto = sweep
    ruler_button.click(run_ruler, [ruler_tasks, ruler_lengths, ruler_samples, ruler_tiers, model_name,
                                   needle_protocol, stop_flag],
                       [ruler_heatmap, ruler_bytes, ruler_table, ruler_csv, ruler_state], api_name="ruler").success(
        sweep_pareto, [sweep_state, sweep_metric, ruler_state], pareto, api_name=False)
    return [ruler_stop, needle_stop]
