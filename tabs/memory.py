"""The Memory tab: what each cache really holds over a turn, measured now in this process.

    with gr.Blocks():
        stop = tabs.memory.build(model_name, stop_flag, codec_tiers)     # inside the app's Blocks, as a tab
"""

from __future__ import annotations

import gradio as gr

from codeckv.serve.guard import guarded
from codeckv.serve.pool import leased
from codeckv.serve.reports import Reports
from codeckv.serve.service import LONG_GPU_SECONDS, MEMORY_CONTEXTS, bar_progress, fresh_stop, memory_request
from codeckv.serve.tab_views import memory_views
from codeckv.serve.zerogpu import gpu

REPORTS = Reports(keep=8, prefix="codeckv-memory-")


@gpu(duration=LONG_GPU_SECONDS)
@guarded
def run_memory(contexts, tiers, new_tokens, model_name, stop=None, progress=gr.Progress()):  # noqa: B008
    """Held, peak and at-rest bytes of native and every chosen tier over prompt lengths: charts, table, CSV."""
    with leased(model_name) as loaded:
        rows = memory_request(loaded, contexts, tiers, new_tokens, bar_progress(progress), stop=fresh_stop(stop))
    return memory_views(rows, REPORTS.fresh())


def build(model_name: gr.Dropdown, stop_flag: gr.State, codec_tiers: list[str]) -> gr.Button:
    """The tab's layout and events; its Stop button (the app wires every Stop to the session's flag)."""
    with gr.Tab("Memory"):
        gr.Markdown("What each cache really holds over a turn (prompt in 512-token chunks, then greedy tokens), "
                    "measured now in this process from the tensors themselves: **held** at the end, the **peak** "
                    "after any forward, and **at rest** between turns (a decoded view dropped). A tier runs on its "
                    "stored codes where a kernel reads them, and with a decoded view. The process-wide peak of "
                    "each turn, one fresh process per row: `python -m codeckv memory`.")
        with gr.Row():
            contexts = gr.CheckboxGroup(list(MEMORY_CONTEXTS), value=[1024, 2048, 4096], label="prompt tokens")
            new_tokens = gr.Slider(1, 64, value=16, step=1, label="new tokens per turn")
        tiers = gr.CheckboxGroup(codec_tiers, value=["turbo-4", "pca-8x"], label="tiers (beside native)")
        with gr.Row():
            button = gr.Button("Measure memory", variant="primary", scale=4)
            stop = gr.Button("Stop", scale=1)
        with gr.Row():
            held = gr.Plot(label="held vs context")
            peak = gr.Plot(label="peak held vs context")
        rows = gr.Dataframe(label="bytes per cache", interactive=False, elem_id="memory-results")
        csv = gr.File(label="download CSV")
    button.click(run_memory, [contexts, tiers, new_tokens, model_name, stop_flag], [held, peak, rows, csv],
                 api_name="memory")
    return stop
