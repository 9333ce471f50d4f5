"""The Advanced accordion (Chat and Inspect): the knobs of codeckv.custom_tier.custom_tier, checked by
codeckv/serve/inputs.py tier_from_knobs when a request reads them.

    knobs = tabs.advanced.advanced_settings()     # inside a tab: the inputs, in tier_from_knobs's order
"""

from __future__ import annotations

import gradio as gr

from codeckv.cache.schedule import MAX_SCHEDULE_CHARS
from codeckv.serve.inputs import BITS_CHOICES


def advanced_settings() -> list:
    """The Advanced accordion. Returns its inputs in order."""
    with gr.Accordion("Advanced: build a custom tier", open=False):
        custom = gr.Checkbox(label="Use these settings instead of the preset", value=False)
        with gr.Row():
            block = gr.Number(label="DCT block size r", value=8, precision=0)
            k = gr.Number(label="k frequencies kept (0 = no DCT)", value=0, precision=0)
            bits = gr.Dropdown(list(BITS_CHOICES), value="4", label="key bits")
            value_bits = gr.Dropdown(["same", *BITS_CHOICES[1:]], value="same", label="value bits")
        with gr.Row():
            group = gr.Number(label="quant group", value=32, precision=0)
            rotation = gr.Checkbox(label="Hadamard rotation + Lloyd-Max levels", value=True)
            keep_first = gr.Number(label="keep_first (sink tokens)", value=0, precision=0)
            keep_recent = gr.Number(label="keep_recent (window)", value=0, precision=0)
        per_layer = gr.Textbox(label="per-layer tiers (these layers get these presets; e.g. 0-3:int8, 29:turbo-3)",
                               value="", max_length=MAX_SCHEDULE_CHARS, max_lines=2)
    return [custom, block, k, bits, value_bits, group, rotation, keep_first, keep_recent, per_layer]
