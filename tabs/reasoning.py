"""The Reasoning tab: word problems with chain of thought, every tier followed along its own long reply.

    with gr.Blocks():
        tabs.reasoning.build(model_name, stop_flag, tier_choices)    # inside the app's Blocks, as a tab

Its handler is run_reasoning: the inputs checked before a model is touched (codeckv/serve/reasoning.py), then the
grid of measure/reasoning.py under the request's time budget and the session's Stop button.
"""

from __future__ import annotations

import gradio as gr

from codeckv.serve.guard import guarded
from codeckv.serve.pool import leased
from codeckv.serve.reasoning import (
    MAX_TAB_BUDGET,
    MAX_TAB_SAMPLES,
    MIN_TAB_BUDGET,
    STEP_CHOICES,
    reasoning_cells,
    reasoning_request,
    reasoning_views,
)
from codeckv.serve.reports import Reports
from codeckv.serve.service import LONG_GPU_SECONDS, bar_progress, fresh_stop
from codeckv.serve.zerogpu import gpu

REPORTS = Reports(keep=8, prefix="codeckv-reasoning-")
INTRO = ("Grade-school word problems generated here from templates (names, objects, numbers and 2-8 arithmetic "
         "steps drawn from a seed), asked few-shot with worked examples. Every tier writes its own chain of thought; "
         "native is fed the same tokens, so the **KL divergence along the tier's own reply** shows whether the error "
         "grows as the cache fills with the tier's own tokens. The final number is read as lm-evaluation-harness "
         "reads GSM8K's. `python -m codeckv reasoning` runs the full grid.")


@gpu(duration=LONG_GPU_SECONDS)
@guarded
def run_reasoning(samples, steps, budget, tiers, model_name, stop=None, progress=gr.Progress()):  # noqa: B008
    """Native and every chosen tier on the word problems: accuracy vs bytes, KLD along the reply, table, CSV."""
    reasoning_cells(samples, steps, budget, tiers)  # refused before a model is touched
    with leased(model_name) as loaded:
        rows = reasoning_request(loaded, samples, steps, budget, tiers, bar_progress(progress),
                                 stop=fresh_stop(stop))
        return reasoning_views(rows, REPORTS.fresh(), loaded.info.name)


def build(model_name: gr.Dropdown, stop_flag: gr.State, tier_choices: list[str]) -> gr.Button:
    """The tab's layout and events; its Stop button (the app wires every Stop to the session's flag)."""
    with gr.Tab("Reasoning"):
        gr.Markdown(INTRO)
        with gr.Row():
            samples = gr.Slider(1, MAX_TAB_SAMPLES, value=4, step=1, label="problems", elem_id="reasoning-problems")
            steps = gr.CheckboxGroup(list(STEP_CHOICES), value=["2", "3"], label="arithmetic steps (in turn)",
                                     elem_id="reasoning-steps")
            budget = gr.Slider(MIN_TAB_BUDGET, MAX_TAB_BUDGET, value=128, step=32, label="reply budget (tokens)",
                               elem_id="reasoning-budget")
        tiers = gr.CheckboxGroup(tier_choices, value=["turbo-3", "turbo-3-skip2"],
                                 label="tiers and peers (beside native)", elem_id="reasoning-tiers")
        with gr.Row():
            button = gr.Button("Run word problems", variant="primary", scale=4)
            stop = gr.Button("Stop", scale=1)
        accuracy = gr.Plot(label="accuracy vs bytes")
        curve = gr.Plot(label="KL divergence along the reply")
        table = gr.Dataframe(label="per tier", interactive=False, elem_id="reasoning-results")
        csv = gr.File(label="download the per-problem CSV")
    button.click(run_reasoning, [samples, steps, budget, tiers, model_name, stop_flag], [accuracy, curve, table, csv],
                 api_name="reasoning")
    return stop
