"""The Tier sweep tab: every chosen tier (and the peers) on long text, or on one chat prompt.

    with gr.Blocks():
        sweep = tabs.sweep.build(model_name, stop_flag, ruler_state, choices, checked, example_prompt)
        sweep.stop, sweep.state, sweep.metric, sweep.pareto      # what the app and the Long context tab wire to

Its handler is run_sweep (codeckv/serve/service.py sweep_request); its quality axis may be the Long context tab's
last RULER grid (`ruler_state`), redrawn without a run (codeckv/serve/tab_views.py sweep_pareto).
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from codeckv.serve.guard import guarded
from codeckv.serve.inputs import TEXT_FILE_TYPES, one_of
from codeckv.serve.pool import leased
from codeckv.serve.reports import Reports
from codeckv.serve.service import (
    LONG_GPU_SECONDS,
    LONG_TEXT,
    METRICS,
    ONE_PROMPT,
    SOURCES,
    bar_progress,
    fresh_stop,
    sweep_request,
    sweep_token_kld,
)
from codeckv.serve.tab_views import sweep_downloads, sweep_pareto, sweep_views
from codeckv.serve.zerogpu import gpu

REPORTS = Reports(keep=16, prefix="codeckv-sweep-")


@gpu(duration=LONG_GPU_SECONDS)
@guarded
def run_sweep(mode, source, pasted, upload, windows, length, prompt, new_tokens, model_name, tiers, metric, stop=None,
              long_context=None, progress=gr.Progress()):  # noqa: B008 - Gradio's idiom
    """Every chosen tier on long text (default) or one chat prompt: table, charts (`long_context`: see sweep_views)."""
    one_of(metric, "quality axis", METRICS)  # refused before a model is touched
    with leased(model_name) as loaded:
        run = sweep_request(loaded, mode, source, pasted, upload, windows, length, prompt, new_tokens, tiers,
                            bar_progress(progress), stop=fresh_stop(stop))
        model = loaded.info.name
    files = sweep_downloads(run, model, REPORTS.fresh())
    views = sweep_views(run, metric, long_context)
    return (run.table, views["pareto"], gr.update(value=views["latency"], visible=views["prompt_mode"]),
            gr.update(value=views["token_match"], visible=views["prompt_mode"]), views["token_kld"], files,
            run.result, gr.update(choices=views["tiers"], value=views["worst"]))


@dataclass
class SweepTab:
    """What other tabs and the app wire to."""

    stop: gr.Button
    state: gr.State  # the last run (its result), for redrawing on another axis
    metric: gr.Radio
    pareto: gr.Plot


def build(model_name: gr.Dropdown, stop_flag: gr.State, ruler_state: gr.State, choices: list[str],
          checked: list[str], example_prompt: str) -> SweepTab:
    """The tab's layout and events."""
    with gr.Tab("Tier sweep"):
        mode = gr.Radio([LONG_TEXT, ONE_PROMPT], value=LONG_TEXT, label="measure on")
        with gr.Group(visible=True) as text_inputs:
            with gr.Row():
                source = gr.Radio(list(SOURCES), value=next(iter(SOURCES)), label="text", scale=3)
                windows = gr.Slider(1, 8, value=2, step=1, label="windows", scale=1)
                length = gr.Slider(128, 2048, value=512, step=128, label="tokens per window", scale=1,
                                   elem_id="sweep-length")
            with gr.Row():
                pasted = gr.Textbox(label="pasted text", lines=3, max_lines=8, scale=3)
                upload = gr.File(label=".txt / .md file", file_types=list(TEXT_FILE_TYPES), scale=1)
        with gr.Group(visible=False) as prompt_inputs:
            with gr.Row():
                prompt = gr.Textbox(value=example_prompt, label="prompt", scale=3)
                new_tokens = gr.Slider(8, 128, value=32, step=8, label="new tokens per tier", scale=1)
        tiers = gr.CheckboxGroup(choices, value=checked, label="tiers, and peers (transformers' QuantizedCache, "
                                                               "llama.cpp's KV types; long text only)")
        with gr.Row():
            button = gr.Button("Run sweep", variant="primary", scale=4)
            stop = gr.Button("Stop", scale=1)
        table = gr.Dataframe(label="results", interactive=False, elem_id="sweep-results")
        metric = gr.Radio(list(METRICS), value="KL divergence", label="quality axis", elem_id="sweep-axis")
        pareto = gr.Plot(label="storage vs quality", elem_id="sweep-pareto")
        latency = gr.Plot(label="decode latency", visible=False)
        token_match = gr.Plot(label="token match", visible=False)
        kld_tier = gr.Dropdown([], label="per-token KL divergence of tier")
        token_kld = gr.Plot(label="per-token KL divergence")
        downloads = gr.File(label="download CSV and JSON", file_count="multiple")
        state = gr.State(None)
    mode.change(lambda chosen: (gr.update(visible=chosen == LONG_TEXT), gr.update(visible=chosen == ONE_PROMPT)),
                mode, [text_inputs, prompt_inputs], api_name=False)
    button.click(run_sweep, [mode, source, pasted, upload, windows, length, prompt, new_tokens, model_name, tiers,
                             metric, stop_flag, ruler_state],
                 [table, pareto, latency, token_match, token_kld, downloads, state, kld_tier], api_name="sweep")
    metric.change(sweep_pareto, [state, metric, ruler_state], pareto, api_name=False)
    kld_tier.change(sweep_token_kld, [state, kld_tier], token_kld, api_name=False)
    return SweepTab(stop, state, metric, pareto)
