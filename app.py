"""KV Codec Studio — Gradio layout and event wiring only; every number and figure comes from codeckv.

Tabs: Chat (native vs codec cache, streamed side by side, on a question or a long document), Inspect
(KV heatmaps, DCT spectra, per-layer errors), Tier sweep (every tier on long text with error bars, or
on one chat prompt), Needle (pass-key retrieval over lengths and depths).
`python app.py` serves on $GRADIO_SERVER_NAME:$PORT (default 127.0.0.1:7860).
"""

from __future__ import annotations

import atexit
import functools
import inspect as pyinspect
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import gradio as gr

from codeckv.figures import inspect_figures, quality_figures, sweep_figures, token_kld_figure, worst_tier
from codeckv.formatting import (
    codec_stats_markdown,
    model_markdown,
    native_stats_markdown,
    progress_markdown,
    quality_table,
    stopped_markdown,
    sweep_table,
)
from codeckv.inputs import DOCUMENTS, TEXT_FILE_TYPES, read_text_file, with_document
from codeckv.measure.chat import ChatSession
from codeckv.measure.corpus import corpus_text
from codeckv.measure.inspect import inspect_tier
from codeckv.measure.needle import as_dicts as needle_dicts
from codeckv.measure.needle import needle_grid
from codeckv.measure.quality import QualityRun, as_dicts, measure_quality
from codeckv.measure.sweep import as_dicts as sweep_dicts
from codeckv.measure.sweep import sweep
from codeckv.measure.table import write_csv, write_json
from codeckv.models import DEFAULT_MODEL, ModelUnavailableError, available_models, shared_model
from codeckv.plots import needle_figure, pareto_figure
from codeckv.tiers import TIERS, custom_tier, get_tier
from kernels import backend_name

CODEC_TIERS = [name for name, tier in TIERS.items() if not tier.is_native]
EXAMPLES = [line for line in (Path(__file__).parent / "assets" / "examples.txt").read_text().splitlines() if line]
LONG_EXAMPLE = ["What does the finally clause do? Answer in two sentences.", next(iter(DOCUMENTS))]
INSPECT_TEXT = corpus_text()[:1500]  # ~370 tokens of the Python reference: enough blocks to see spectra
MAX_NEW_TOKENS = 256
BITS_CHOICES = ["none", "2", "3", "4", "8"]
LONG_TEXT = "long text: KL divergence, top-1, ΔNLL with their spread over windows"
ONE_PROMPT = "one chat prompt: latency, token match, first divergence (a single sample)"
SOURCES = {"embedded corpus (Python reference)": "corpus", "held-out text (stdlib docstrings)": "docstrings",
           "pasted text": "pasted", "uploaded file": "file"}
METRICS = {"KL divergence": "kld", "ΔNLL": "delta_nll_pct"}
NEEDLE_LENGTHS = [512, 1024, 2048, 4096, 8000]
NEEDLE_DEPTHS = ["0%", "25%", "50%", "75%", "100%"]
REPORTS = Path(tempfile.mkdtemp(prefix="codeckv-reports-"))  # sweep downloads; the newest KEEP_REPORTS are kept
KEEP_REPORTS = 16
atexit.register(shutil.rmtree, REPORTS, ignore_errors=True)


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


def require_text(text) -> None:
    """A clear error for an empty prompt (its length is checked where it is tokenized, in codeckv)."""
    if not isinstance(text, str) or not text.strip():
        raise gr.Error("The prompt is empty: type something first.")


def chat_panels(session: ChatSession, pending: tuple[str, str, str] | None = None) -> tuple[list, list]:
    """The two chat panels: every exchange so far (the native and the codec side), then the turn in progress."""
    native, codec = [], []
    turns = [(e.shown, e.native, e.codec) for e in session.exchanges] + ([pending] if pending else [])
    for shown, native_reply, codec_reply in turns:
        native += [{"role": "user", "content": shown}, {"role": "assistant", "content": native_reply}]
        codec += [{"role": "user", "content": shown}, {"role": "assistant", "content": codec_reply}]
    return native, codec


@guarded
def chat_turn(message, document, upload, model_name, tier_name, max_new_tokens, materialization_free, *rest):
    """Stream one turn in both panels; both caches see the same conversation (the native replies)."""
    *advanced, session = rest
    session = session if isinstance(session, ChatSession) else ChatSession()
    require_text(message)
    loaded = shared_model(model_name)
    tier = resolve_tier(tier_name, *advanced)
    user, shown = with_document(message, document, upload)
    for update in session.ask(loaded, user, tier, int(max_new_tokens), bool(materialization_free), shown):
        native, codec = chat_panels(session, (shown, update.native.text, update.codec.text))
        if update.result is None:
            waiting = progress_markdown(update)
            yield native, codec, waiting, waiting, "", None, None, session
        else:
            stats = native_stats_markdown(update.result), codec_stats_markdown(update.result)
            yield native, codec, *stats, "", None, None, session


def stop_turn(session):
    """Stop: keep what both sides generated and say what was measured before the stop."""
    if not isinstance(session, ChatSession):
        return gr.update(), gr.update(), gr.update(), gr.update()
    last = session.stop()
    native, codec = chat_panels(session)
    return native, codec, stopped_markdown(last, "native"), stopped_markdown(last, "codec")


def clear_chat(session):
    """Forget the conversation and release both caches."""
    if isinstance(session, ChatSession):
        session.clear()
    return [], [], "", "", session


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


def report_folder() -> Path:
    """A fresh folder for one sweep's downloads; older ones beyond KEEP_REPORTS are removed."""
    folders = sorted(REPORTS.iterdir(), key=lambda p: p.stat().st_mtime)
    for old in folders[: max(0, len(folders) - KEEP_REPORTS + 1)]:
        shutil.rmtree(old, ignore_errors=True)
    folder = REPORTS / uuid.uuid4().hex
    folder.mkdir()
    return folder


@guarded
def run_sweep(mode, source, pasted, upload, windows, length, prompt, new_tokens, model_name, tier_names, metric,
              progress=gr.Progress()):  # noqa: B008 - Gradio's idiom
    """Every chosen tier: on long text (default) or on one chat prompt; table, charts, CSV / JSON downloads."""
    if not tier_names:
        raise gr.Error("Choose at least one tier to sweep.")
    loaded = shared_model(model_name)
    report = lambda done, total, message: progress((done, total), desc=message)  # noqa: E731
    if mode == ONE_PROMPT:
        require_text(prompt)
        result = sweep(loaded, [{"role": "user", "content": prompt}], list(tier_names), int(new_tokens),
                       progress=report)
        table, figures, rows = sweep_table(result.rows), sweep_figures(result), sweep_dicts(result.rows)
        pareto = figures["pareto_kld"]
        latency, match = gr.update(value=figures["latency"], visible=True), gr.update(value=figures["token_match"],
                                                                                      visible=True)
        about = {"mode": "one prompt", "prompt": prompt, "new_tokens": int(new_tokens)}
    else:
        kind = SOURCES[source]
        text = pasted if kind == "pasted" else read_text_file(upload) if kind == "file" else None
        if kind in ("pasted", "file"):
            require_text(text)
        result = measure_quality(loaded, list(tier_names), int(windows), int(length),
                                 kind if text is None else "corpus", text, report)
        table, figures, rows = quality_table(result.rows), quality_figures(result), as_dicts(result.rows)
        pareto = figures["pareto_kld" if METRICS[metric] == "kld" else "pareto_nll"]
        latency, match = gr.update(visible=False), gr.update(visible=False)
        about = {"mode": "long text", "source": kind, "windows": int(windows), "tokens_per_window": int(length)}
    folder = report_folder()
    files = [str(write_csv(rows, folder / "sweep.csv")),
             str(write_json({"model": loaded.info.name, **about, "rows": rows}, folder / "sweep.json"))]
    choice = gr.update(choices=[r.tier for r in result.rows if r.tier != "native"], value=worst_tier(result))
    return table, pareto, latency, match, figures["token_kld"], files, result, choice


def pareto_for(result, metric):
    """Redraw the Pareto chart of the last sweep for the chosen quality metric (no re-run)."""
    if result is None:
        return None
    if isinstance(result, QualityRun):
        return quality_figures(result)["pareto_kld" if METRICS[metric] == "kld" else "pareto_nll"]
    return pareto_figure(result.rows, METRICS[metric], title="Storage vs quality (one reply)")


def kld_for(result, tier):
    """Per-token KL divergence of one swept tier (empty until a sweep ran)."""
    names = [r.tier for r in result.rows] if result is not None else []
    return token_kld_figure(result, tier) if tier in names and tier != "native" else None


@guarded
def run_needle(lengths, depths, tier_names, model_name, progress=gr.Progress()):  # noqa: B008 - Gradio's idiom
    """Pass-key retrieval of native and every chosen tier over prompt lengths and key depths."""
    if not lengths or not depths:
        raise gr.Error("Choose at least one length and one depth.")
    loaded = shared_model(model_name)
    grid = needle_grid(loaded, list(tier_names or []), sorted(int(n) for n in lengths),
                       sorted(float(d.rstrip("%")) / 100 for d in depths),
                       progress=lambda done, total, message: progress((done, total), desc=message))
    rows = needle_dicts(grid.rows)
    path = write_csv(rows, report_folder() / "needle.csv")
    table = [[r["tier"], r["tokens"], f"{r['depth']:.0%}", r["key"], "yes" if r["retrieved"] else "no",
              r["answer"]] for r in rows]
    return needle_figure(grid), {"headers": ["tier", "prompt tokens", "depth", "key", "retrieved", "answer"],
                                 "data": table}, str(path)


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


def release_session(session) -> None:
    """The browser tab closed (or the session expired): drop its caches."""
    if isinstance(session, ChatSession):
        session.clear()


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
        session = gr.State(None, time_to_live=3600, delete_callback=release_session)
        with gr.Row():
            tier_name = gr.Dropdown(CODEC_TIERS, value="turbo-4", label="codec tier", scale=2)
            max_tokens = gr.Slider(8, MAX_NEW_TOKENS, value=96, step=8, label="max new tokens", scale=2)
            materialization_free = gr.Checkbox(
                label="materialization-free: attention reads the stored codes, no decoded view", value=False, scale=1
            )
        chat_advanced = advanced_settings()
        with gr.Accordion("Long document: ask about a text, so the archive holds most of the context", open=False):
            with gr.Row():
                document = gr.Dropdown(list(DOCUMENTS), value=None, label="embedded document", scale=2)
                upload = gr.File(label="or upload a .txt / .md file", file_types=list(TEXT_FILE_TYPES), scale=1)
            gr.Markdown("The document goes before your next message (once); the conversation keeps it.")
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
            clear = gr.Button("Clear", scale=1, elem_id="clear")
        gr.Examples([[e, None] for e in EXAMPLES] + [LONG_EXAMPLE], inputs=[message, document])

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
        sweep_mode = gr.Radio([LONG_TEXT, ONE_PROMPT], value=LONG_TEXT, label="measure on")
        with gr.Group(visible=True) as text_inputs:
            with gr.Row():
                sweep_source = gr.Radio(list(SOURCES), value=next(iter(SOURCES)), label="text", scale=3)
                sweep_windows = gr.Slider(1, 8, value=2, step=1, label="windows", scale=1)
                sweep_length = gr.Slider(128, 2048, value=512, step=128, label="tokens per window", scale=1)
            with gr.Row():
                sweep_pasted = gr.Textbox(label="pasted text", lines=3, max_lines=8, scale=3)
                sweep_upload = gr.File(label=".txt / .md file", file_types=list(TEXT_FILE_TYPES), scale=1)
        with gr.Group(visible=False) as prompt_inputs:
            with gr.Row():
                sweep_prompt = gr.Textbox(value=EXAMPLES[1], label="prompt", scale=3)
                sweep_tokens = gr.Slider(8, 128, value=32, step=8, label="new tokens per tier", scale=1)
        sweep_tiers = gr.CheckboxGroup(list(TIERS), value=CODEC_TIERS, label="tiers")
        sweep_button = gr.Button("Run sweep", variant="primary")
        sweep_table_out = gr.Dataframe(label="results", interactive=False, elem_id="sweep-results")
        sweep_metric = gr.Radio(list(METRICS), value="KL divergence", label="quality axis")
        pareto = gr.Plot(label="storage vs quality")
        latency = gr.Plot(label="decode latency", visible=False)
        token_match = gr.Plot(label="token match", visible=False)
        kld_tier = gr.Dropdown([], label="per-token KL divergence of tier")
        token_kld = gr.Plot(label="per-token KL divergence")
        downloads = gr.File(label="download CSV and JSON", file_count="multiple")
        sweep_state = gr.State(None)

    with gr.Tab("Needle"):
        gr.Markdown("A 5-digit pass key hidden in filler text at several depths and lengths: does the greedy "
                    "answer still contain it? Native runs once per cell; every tier answers from the same prompt.")
        with gr.Row():
            needle_lengths = gr.CheckboxGroup(NEEDLE_LENGTHS, value=NEEDLE_LENGTHS[:3], label="prompt tokens")
            needle_depths = gr.CheckboxGroup(NEEDLE_DEPTHS, value=["0%", "50%", "100%"], label="depth of the key")
        needle_tiers = gr.CheckboxGroup(CODEC_TIERS, value=["turbo-4", "jpeg-k2"], label="tiers (beside native)")
        needle_button = gr.Button("Run needle test", variant="primary")
        needle_plot = gr.Plot(label="retrieved")
        needle_table = gr.Dataframe(label="answers", interactive=False, elem_id="needle-results")
        needle_csv = gr.File(label="download CSV")

    demo.load(model_panel, model_name, [model_info, layer, head])
    model_name.change(model_panel, model_name, [model_info, layer, head])
    chat_inputs = [message, document, upload, model_name, tier_name, max_tokens, materialization_free,
                   *chat_advanced, session]
    chat_outputs = [native_chat, codec_chat, native_stats, codec_stats, message, document, upload, session]
    turns = [
        send.click(chat_turn, chat_inputs, chat_outputs, api_name="chat"),
        message.submit(chat_turn, chat_inputs, chat_outputs, api_name=False),
    ]
    stop.click(stop_turn, session, [native_chat, codec_chat, native_stats, codec_stats], cancels=turns,
               api_name=False)
    cleared = [native_chat, codec_chat, native_stats, codec_stats, session]
    clear.click(clear_chat, session, cleared, cancels=turns, api_name=False)
    for panel in (native_chat, codec_chat):  # clearing one panel clears the conversation: both stay in step
        panel.clear(clear_chat, session, cleared, cancels=turns, api_name=False)
    inspect_inputs = [inspect_prompt, model_name, inspect_tier_name, *inspect_advanced, layer, head, which]
    inspect_outputs = [heatmap, spectrum, layer_errors, var_ratio, inspect_summary]
    inspect_button.click(inspect_kv, inspect_inputs, inspect_outputs, api_name="inspect")
    for slider in (layer, head):
        slider.release(inspect_kv, inspect_inputs, inspect_outputs, api_name=False)
    which.change(inspect_kv, inspect_inputs, inspect_outputs, api_name=False)
    sweep_mode.change(lambda mode: (gr.update(visible=mode == LONG_TEXT), gr.update(visible=mode == ONE_PROMPT)),
                      sweep_mode, [text_inputs, prompt_inputs], api_name=False)
    sweep_button.click(
        run_sweep,
        [sweep_mode, sweep_source, sweep_pasted, sweep_upload, sweep_windows, sweep_length, sweep_prompt,
         sweep_tokens, model_name, sweep_tiers, sweep_metric],
        [sweep_table_out, pareto, latency, token_match, token_kld, downloads, sweep_state, kld_tier],
        api_name="sweep",
    )
    sweep_metric.change(pareto_for, [sweep_state, sweep_metric], pareto, api_name=False)
    kld_tier.change(kld_for, [sweep_state, kld_tier], token_kld, api_name=False)
    needle_button.click(run_needle, [needle_lengths, needle_depths, needle_tiers, model_name],
                        [needle_plot, needle_table, needle_csv], api_name="needle")

if __name__ == "__main__":
    demo.queue(default_concurrency_limit=2, max_size=64).launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("PORT", os.environ.get("GRADIO_SERVER_PORT", "7860"))),
        show_error=True,
    )
