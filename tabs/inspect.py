"""The Inspect tab: one text prefilled and captured, then a layer's and head's K or V as the chosen tier stores it.

    with gr.Blocks():
        layer, head = tabs.inspect.build(model_name, codec_tiers, layers, kv_heads)   # inside the app's Blocks

Its handler is inspect_kv (codeckv/serve/service.py inspect_request does the work); the app resizes the layer and
head sliders it returns when another model is picked.
"""

from __future__ import annotations

import gradio as gr

from codeckv.corpus import corpus_text
from codeckv.serve.guard import guarded
from codeckv.serve.inputs import tier_from_knobs, user_text
from codeckv.serve.limits import Limits
from codeckv.serve.pool import leased
from codeckv.serve.service import INSPECT_GPU_SECONDS, inspect_request
from codeckv.serve.zerogpu import gpu
from tabs.advanced import advanced_settings

INSPECT_TEXT = corpus_text()[:1500]  # ~370 tokens of the Python reference: enough blocks to see spectra


@gpu(duration=INSPECT_GPU_SECONDS)
@guarded
def inspect_kv(prompt, model_name, tier_name, *advanced_and_view):
    """Heatmaps of one (layer, head), DCT and channel spectra, per-layer errors and smoothness for a tier."""
    *advanced, layer, head, which = advanced_and_view
    prompt = user_text(prompt, "the text")
    tier = tier_from_knobs(tier_name, *advanced)
    with leased(model_name) as loaded:
        figures, summary = inspect_request(loaded, prompt, tier, layer, head, which, Limits.from_env())
    return (figures["heatmap"], figures["spectrum"], figures["channel_spectrum"], figures["layer_errors"],
            figures["var_ratio"], figures["layer_tiers"], summary)


def build(model_name: gr.Dropdown, codec_tiers: list[str], layers: int, kv_heads: int) -> tuple[gr.Slider, gr.Slider]:
    """The tab's layout and events; its layer and KV-head sliders (the app resizes them to the model)."""
    with gr.Tab("Inspect"):
        with gr.Row():
            prompt = gr.Textbox(value=INSPECT_TEXT, label="text (prefilled, then captured)", lines=3, max_lines=6,
                                scale=3)
            tier_name = gr.Dropdown(codec_tiers, value="jpeg-k2", label="codec tier", scale=1)
        advanced = advanced_settings()
        with gr.Row():
            layer = gr.Slider(0, layers - 1, value=0, step=1, label="layer")
            head = gr.Slider(0, kv_heads - 1, value=0, step=1, label="KV head")
            which = gr.Radio(["K", "V"], value="K", label="tensor")
            button = gr.Button("Inspect", variant="primary")
        summary = gr.Markdown()
        heatmap = gr.Plot(label="original / reconstructed / |error|")
        with gr.Row():
            spectrum = gr.Plot(label="DCT spectrum (along the sequence)")
            channel_spectrum = gr.Plot(label="channel spectrum (across heads and channels)")
        with gr.Row():
            layer_errors = gr.Plot(label="per-layer error")
            var_ratio = gr.Plot(label="Var(Δ)/Var(X)")
        layer_tiers = gr.Plot(label="tier per layer")
    inputs = [prompt, model_name, tier_name, *advanced, layer, head, which]
    outputs = [heatmap, spectrum, channel_spectrum, layer_errors, var_ratio, layer_tiers, summary]
    button.click(inspect_kv, inputs, outputs, api_name="inspect")
    for slider in (layer, head):
        slider.release(inspect_kv, inputs, outputs, api_name=False)
    which.change(inspect_kv, inputs, outputs, api_name=False)
    return layer, head
