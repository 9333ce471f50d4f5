"""KV Codec Studio — Gradio layout and event wiring only; every number and figure comes from codeckv.

Tabs: Chat (native vs codec cache, streamed side by side), Inspect (KV heatmaps, DCT spectra,
per-layer errors), Tier sweep (every tier on one prompt: table, charts, CSV/JSON downloads).
`python app.py` serves on $GRADIO_SERVER_NAME:$PORT (default 127.0.0.1:7860).
"""

from __future__ import annotations

import functools
import inspect as pyinspect
import os
import tempfile
from pathlib import Path

import gradio as gr

from codeckv.figures import inspect_figures, sweep_figures, token_nll_figure, worst_tier
from codeckv.formatting import codec_stats_markdown, model_markdown, native_stats_markdown
from codeckv.measure.corpus import corpus_text
from codeckv.measure.inspect import inspect_tier
from codeckv.measure.side_by_side import stream_side_by_side
from codeckv.measure.sweep import as_dicts, sweep
from codeckv.measure.table import write_csv, write_json
from codeckv.models import DEFAULT_MODEL, ModelUnavailableError, available_models, shared_model
from codeckv.tiers import TIERS, custom_tier, get_tier
from kernels import backend_name

CODEC_TIERS = [name for name, tier in TIERS.items() if not tier.is_native]
EXAMPLES = [line for line in (Path(__file__).parent / "assets" / "examples.txt").read_text().splitlines() if line]
INSPECT_TEXT = corpus_text()[:1500]  # ~370 tokens of the Python reference: enough blocks to see spectra
MAX_NEW_TOKENS = 256
SWEEP_COLUMNS = ["tier", "ratio_vs_bf16", "delta_nll_pct", "decode_ms", "latency_ratio", "token_match", "psnr_db"]
BITS_CHOICES = ["none", "2", "3", "4", "8"]


def guarded(handler):
    """Show any failure as a clear gr.Error (never a stack trace); the app keeps serving."""

    def explain(err: Exception) -> gr.Error:
        if isinstance(err, gr.Error):
            return err
        if isinstance(err, ValueError | ModelUnavailableError):
            return gr.Error(str(err))
        return gr.Error(f"{type(err).__name__}: {err}")

    if pyinspect.isgeneratorfunction(handler):

        @functools.wraps(handler)
        def stream(*args, **kwargs):
            try:
                yield from handler(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - every failure becomes a message, none a crash
                raise explain(err) from err

        return stream

    @functools.wraps(handler)
    def call(*args, **kwargs):
        try:
            return handler(*args, **kwargs)
        except Exception as err:  # noqa: BLE001
            raise explain(err) from err

    return call


def resolve_tier(name, custom, block_size, k, bits, value_bits, group, rotation, keep_first, keep_recent):
    """The chosen preset, or a custom tier from the Advanced settings (ValueError names allowed values)."""
    if not custom:
        return get_tier(name)
    return custom_tier(
        block_size=int(block_size),
        k=int(k) if k else None,
        bits=None if bits == "none" else int(bits),
        value_bits=None if value_bits in ("same", None) else int(value_bits),
        group=int(group),
        rotation=bool(rotation),
        lloyd_max=bool(rotation and bits != "none"),
        keep_first=int(keep_first),
        keep_recent=int(keep_recent),
    )


def require_text(prompt) -> None:
    """A clear error for an empty prompt (its length is checked where it is tokenized, in codeckv)."""
    text = prompt if isinstance(prompt, str) else (prompt[-1]["content"] if prompt else "")
    if not text.strip():
        raise gr.Error("The prompt is empty: type something first.")


def _text(content) -> str:
    """A chat message's content as text (Gradio may hand back a list of parts)."""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else [content]
    return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in parts)


@guarded
def chat_turn(message, native_chat, codec_chat, model_name, tier_name, max_new_tokens, materialization_free, *advanced):
    """Stream one turn in both panels; both runs see the same conversation (the native replies)."""
    loaded = shared_model(model_name)
    tier = resolve_tier(tier_name, *advanced)
    conversation = [{"role": m["role"], "content": _text(m["content"])} for m in native_chat or []]
    conversation.append({"role": "user", "content": message or ""})
    require_text(conversation)
    native_chat = [*conversation, {"role": "assistant", "content": ""}]
    codec_chat = [*(codec_chat or []), {"role": "user", "content": message}, {"role": "assistant", "content": ""}]
    waiting = "generating…"
    for update in stream_side_by_side(loaded, conversation, tier, int(max_new_tokens),
                                      materialization_free=bool(materialization_free)):
        native_chat[-1]["content"], codec_chat[-1]["content"] = update.native.text, update.codec.text
        if update.phase == "scoring":
            waiting = "scoring the turn's NLL…"
        if update.result is None:
            yield native_chat, codec_chat, waiting, waiting, ""
        else:
            yield native_chat, codec_chat, native_stats_markdown(update.result), codec_stats_markdown(update.result), ""


@guarded
def inspect_kv(prompt, model_name, tier_name, *advanced_and_view):
    """Heatmaps of one (layer, head), DCT spectra, per-layer errors and smoothness for a tier."""
    *advanced, layer, head, which = advanced_and_view
    loaded = shared_model(model_name)
    tier = resolve_tier(tier_name, *advanced)
    require_text(prompt)
    layer, head = min(int(layer), len(loaded.info.layer_types) - 1), min(int(head), loaded.info.num_kv_heads - 1)
    view = inspect_tier(loaded, prompt, tier, layer=layer, head=head)
    start, end = view.head.archived
    errors = view.layers[layer]
    summary = (
        f"**{tier.name}** on layer {layer}, head {head}: tokens {start}–{end} of {len(view.tokens)} went through "
        f"the codec (the rest stays raw). Layer {layer}: K PSNR {errors.key_psnr_db:.1f} dB, "
        f"V PSNR {errors.value_psnr_db:.1f} dB, attention-output error {errors.attention_rel_error:.2%}."
    )
    figures = inspect_figures(view)
    heatmap = figures["heatmap_key" if which == "K" else "heatmap_value"]
    return heatmap, figures["spectrum"], figures["layer_errors"], figures["var_ratio"], summary


@guarded
def run_sweep(prompt, model_name, tier_names, max_new_tokens, progress=gr.Progress()):  # noqa: B008 - Gradio's idiom
    """Every chosen tier on one prompt: table, charts and downloadable CSV / JSON."""
    if not tier_names:
        raise gr.Error("Choose at least one tier to sweep.")
    loaded = shared_model(model_name)
    conversation = [{"role": "user", "content": prompt or ""}]
    require_text(conversation)
    result = sweep(
        loaded, conversation, list(tier_names), int(max_new_tokens),
        progress=lambda done, total, message: progress((done, total), desc=message),
    )
    rows = as_dicts(result.rows)
    out = Path(tempfile.mkdtemp(prefix="codeckv-sweep-"))
    csv_path = write_csv(rows, out / "sweep.csv")
    json_path = write_json({"model": loaded.info.name, "prompt": prompt, "rows": rows}, out / "sweep.json")
    table = [[round(v, 4) if isinstance(v, float) else v for v in (row[c] for c in SWEEP_COLUMNS)] for row in rows]
    figures = sweep_figures(result)
    return (
        table,
        figures["pareto"],
        figures["latency"],
        figures["token_match"],
        figures["token_nll"],
        [str(csv_path), str(json_path)],
        result,
        gr.update(choices=list(result.comparisons), value=worst_tier(result)),
    )


def nll_figure(result, label):
    """Per-token NLL difference of one swept tier (empty until a sweep ran)."""
    if result is None or label not in result.comparisons:
        return None
    return token_nll_figure(result, label)


@guarded
def model_panel(model_name):
    """Load (once) the chosen model and describe it; slider ranges follow its shape."""
    info = shared_model(model_name).info
    return (
        model_markdown(info, backend_name()),
        gr.update(maximum=len(info.layer_types) - 1),
        gr.update(maximum=info.num_kv_heads - 1),
    )


def advanced_settings():
    """The Advanced accordion: the knobs of codeckv.tiers.custom_tier. Returns the inputs in order."""
    with gr.Accordion("Advanced: build a custom tier", open=False):
        custom = gr.Checkbox(label="Use these settings instead of the preset", value=False)
        with gr.Row():
            block = gr.Number(label="DCT block size r", value=8, precision=0)
            k = gr.Number(label="k frequencies kept (0 = no DCT)", value=0, precision=0)
            bits = gr.Dropdown(BITS_CHOICES, value="4", label="key bits")
            value_bits = gr.Dropdown(["same", *BITS_CHOICES[1:]], value="same", label="value bits")
        with gr.Row():
            group = gr.Number(label="quant group", value=32, precision=0)
            rotation = gr.Checkbox(label="Hadamard rotation + Lloyd-Max levels", value=True)
            keep_first = gr.Number(label="keep_first (sink tokens)", value=0, precision=0)
            keep_recent = gr.Number(label="keep_recent (window)", value=0, precision=0)
    return [custom, block, k, bits, value_bits, group, rotation, keep_first, keep_recent]


def model_shape(name: str) -> tuple[int, int]:
    """(layers, KV heads) of a model, for the Inspect sliders at build time; (1, 1) if it cannot load here."""
    try:
        info = shared_model(name).info
    except (ModelUnavailableError, ValueError, OSError):
        return 1, 1  # the model panel shows why when the page loads
    return len(info.layer_types), info.num_kv_heads


MODELS = available_models() or [DEFAULT_MODEL]
LAYERS, KV_HEADS = model_shape(MODELS[0])

with gr.Blocks(title="KV Codec Studio") as demo:
    gr.Markdown(
        "# KV Codec Studio\nThe same model, twice: its native KV cache against a compressed codec cache. "
        "Every number below is measured when you press the button."
    )
    with gr.Accordion("Model and backend", open=False):
        model_name = gr.Dropdown(MODELS, value=MODELS[0], label="model", allow_custom_value=True)
        model_info = gr.Markdown()

    with gr.Tab("Chat"):
        with gr.Row():
            tier_name = gr.Dropdown(CODEC_TIERS, value="turbo-4", label="codec tier", scale=2)
            max_tokens = gr.Slider(8, MAX_NEW_TOKENS, value=96, step=8, label="max new tokens", scale=2)
            materialization_free = gr.Checkbox(
                label="materialization-free: attention reads the stored codes, no decoded view", value=False, scale=1
            )
        chat_advanced = advanced_settings()
        with gr.Row(equal_height=True):
            with gr.Column():
                native_chat = gr.Chatbot(label="native cache", height=420)
                native_stats = gr.Markdown(elem_id="native-stats")
            with gr.Column():
                codec_chat = gr.Chatbot(label="codec cache", height=420)
                codec_stats = gr.Markdown(elem_id="codec-stats")
        with gr.Row():
            message = gr.Textbox(placeholder="Ask something…", show_label=False, scale=5, elem_id="message")
            send = gr.Button("Send", variant="primary", scale=1)
            stop = gr.Button("Stop", scale=1)
            clear = gr.Button("Clear", scale=1)
        gr.Examples(EXAMPLES, inputs=message)

    with gr.Tab("Inspect"):
        with gr.Row():
            inspect_prompt = gr.Textbox(
                value=INSPECT_TEXT, label="text (prefilled, then captured)", lines=3, max_lines=6, scale=3
            )
            inspect_tier_name = gr.Dropdown(CODEC_TIERS, value="jpeg-k2", label="codec tier", scale=1)
        inspect_advanced = advanced_settings()
        with gr.Row():
            layer = gr.Slider(0, LAYERS - 1, value=0, step=1, label="layer")
            head = gr.Slider(0, KV_HEADS - 1, value=0, step=1, label="KV head")
            which = gr.Radio(["K", "V"], value="K", label="tensor")
            inspect_button = gr.Button("Inspect", variant="primary")
        inspect_summary = gr.Markdown()
        heatmap = gr.Plot(label="original / reconstructed / |error|")
        spectrum = gr.Plot(label="DCT spectrum")
        with gr.Row():
            layer_errors = gr.Plot(label="per-layer error")
            var_ratio = gr.Plot(label="Var(Δ)/Var(X)")

    with gr.Tab("Tier sweep"):
        with gr.Row():
            sweep_prompt = gr.Textbox(value=EXAMPLES[1], label="prompt", scale=3)
            sweep_tokens = gr.Slider(8, 128, value=32, step=8, label="new tokens per tier", scale=1)
        sweep_tiers = gr.CheckboxGroup(list(TIERS), value=CODEC_TIERS, label="tiers")
        sweep_button = gr.Button("Run sweep", variant="primary")
        sweep_table = gr.Dataframe(headers=SWEEP_COLUMNS, label="results", interactive=False, elem_id="sweep-results")
        pareto = gr.Plot(label="storage vs ΔNLL")
        latency = gr.Plot(label="decode latency")
        token_match = gr.Plot(label="token match")
        nll_tier = gr.Dropdown([], label="per-token NLL of tier")
        token_nll = gr.Plot(label="per-token NLL difference")
        downloads = gr.File(label="download CSV and JSON", file_count="multiple")
        sweep_state = gr.State(None)

    demo.load(model_panel, model_name, [model_info, layer, head])
    model_name.change(model_panel, model_name, [model_info, layer, head])
    chat_inputs = [message, native_chat, codec_chat, model_name, tier_name, max_tokens, materialization_free,
                   *chat_advanced]
    chat_outputs = [native_chat, codec_chat, native_stats, codec_stats, message]
    turns = [
        send.click(chat_turn, chat_inputs, chat_outputs, api_name="chat"),
        message.submit(chat_turn, chat_inputs, chat_outputs, api_name=False),
    ]
    stop.click(None, None, None, cancels=turns)
    clear.click(lambda: ([], [], "", ""), None, [native_chat, codec_chat, native_stats, codec_stats], cancels=turns)
    inspect_inputs = [inspect_prompt, model_name, inspect_tier_name, *inspect_advanced, layer, head, which]
    inspect_outputs = [heatmap, spectrum, layer_errors, var_ratio, inspect_summary]
    inspect_button.click(inspect_kv, inspect_inputs, inspect_outputs, api_name="inspect")
    for slider in (layer, head):
        slider.release(inspect_kv, inspect_inputs, inspect_outputs, api_name=False)
    which.change(inspect_kv, inspect_inputs, inspect_outputs, api_name=False)
    sweep_button.click(
        run_sweep,
        [sweep_prompt, model_name, sweep_tiers, sweep_tokens],
        [sweep_table, pareto, latency, token_match, token_nll, downloads, sweep_state, nll_tier],
        api_name="sweep",
    )
    nll_tier.change(nll_figure, [sweep_state, nll_tier], token_nll, api_name=False)

if __name__ == "__main__":
    demo.queue(default_concurrency_limit=2, max_size=64).launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("PORT", os.environ.get("GRADIO_SERVER_PORT", "7860"))),
        show_error=True,
    )
