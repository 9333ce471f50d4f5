"""KV Codec Studio: Gradio layout and event wiring only (every number comes from codeckv; serve/ does each request).
`python app.py` serves on $GRADIO_SERVER_NAME:$PORT and prepares the model and its PCA tiers in the background."""

from __future__ import annotations

from codeckv.serve.zerogpu import gpu  # first: on ZeroGPU `spaces` patches torch before anything touches CUDA

# isort: split
import os
from pathlib import Path

import gradio as gr

import tabs.advanced
import tabs.inspect
import tabs.long_context
import tabs.memory
import tabs.reasoning
import tabs.sweep
from codeckv.measure.chat import ChatSession
from codeckv.measure.peers import PEER_NAMES, PEERS, absent_reason
from codeckv.models import DEFAULT_MODEL
from codeckv.serve.formatting import model_markdown
from codeckv.serve.guard import guarded
from codeckv.serve.inputs import (
    CACHE_FILE_TYPES,
    DOCUMENTS,
    TEXT_FILE_TYPES,
    checked_chat,
)
from codeckv.serve.limits import Limits, StopFlag, keep_out_of_collections, release_memory
from codeckv.serve.pool import POOL, leased
from codeckv.serve.preparation import PREPARATION
from codeckv.serve.reasoning import BOUNDARY_CHOICES
from codeckv.serve.reports import Reports
from codeckv.serve.service import (
    DOWNLOAD_GPU_SECONDS,
    RESUME_GPU_SECONDS,
    chat_download,
    chat_gpu_seconds,
    chat_request,
    chat_resume,
    chat_stop,
    end_session,
    model_shape,
    preparation_text,
    saved_model,
)
from codeckv.tiers import TIERS

CODEC_TIERS = [name for name, tier in TIERS.items() if not tier.is_native]
INSTALLED_PEERS = [name for name, peer in PEERS.items() if absent_reason(peer) is None]  # beside the tiers by default
EXAMPLES = [line for line in (Path(__file__).parent / "assets" / "examples.txt").read_text().splitlines() if line]
LONG_EXAMPLE = ["What does the finally clause do? Answer in two sentences.", next(iter(DOCUMENTS))]
LIMITS = Limits.from_env()  # the operator's per-request budgets (codeckv/serve/limits.py); requests read them afresh
CACHE_FILES = Reports(keep=4, prefix="codeckv-caches-")  # downloaded codec caches: large, so only the newest 4

@gpu(duration=chat_gpu_seconds)
@guarded
def chat_turn(message, document, upload, model_name, tier_name, max_new_tokens, decoded_view, *rest):
    """Stream one turn in both panels; both caches see the same conversation (the native replies)."""
    *advanced, session = rest
    session = session if isinstance(session, ChatSession) else ChatSession()
    limits = Limits.from_env()
    user, shown, tier, new_tokens = checked_chat(message, document, upload, tier_name, max_new_tokens, advanced, limits)
    try:
        for native, codec, native_stats, codec_stats in chat_request(POOL, model_name, session, user, shown, tier,
                                                                     new_tokens, decoded_view, limits):
            yield native, codec, native_stats, codec_stats, "", None, None, session
    finally:
        release_memory()


def stop_turn(session):
    """Stop: keep what both sides generated and say what was measured before the stop."""
    if not isinstance(session, ChatSession):
        return gr.update(), gr.update(), gr.update(), gr.update()
    return chat_stop(session)


@gpu(duration=DOWNLOAD_GPU_SECONDS)
@guarded
def download_cache(session):
    """The codec cache of this conversation (archive, raw tokens, token ids, exchanges) as a .kvc file."""
    with POOL.lease(saved_model(session)) as loaded:
        return chat_download(loaded, session, CACHE_FILES.fresh())


@gpu(duration=RESUME_GPU_SECONDS)
@guarded
def resume_chat(upload, model_name, session):
    """Continue the conversation of an uploaded .kvc file; the tier and view controls follow the file."""
    session = session if isinstance(session, ChatSession) else ChatSession()
    with leased(model_name) as loaded:
        native, codec, native_note, codec_note, tier, on_codes = chat_resume(loaded, session, upload, Limits.from_env())
    return native, codec, native_note, codec_note, tier, not on_codes, False, None, session


def clear_chat(session):
    """Forget the conversation and release both caches."""
    end_session(session)
    release_memory()
    return [], [], "", "", session


def request_stop(flag):
    """A long-running tab's Stop button: the running request stops at its next step."""
    if isinstance(flag, StopFlag):
        flag.request()


@guarded
def model_panel(model_name):
    """Load (once) the chosen model and describe it; slider ranges follow its shape; its PCA tiers are calibrated
    in the background, as the default model's are (the tier picker's timer shows them)."""
    info = POOL.get(model_name).info
    PREPARATION.start(model_name)
    return (model_markdown(info), gr.update(maximum=len(info.layer_types) - 1),
            gr.update(maximum=info.num_kv_heads - 1), gr.Timer(active=bool(preparation_text())))


MODELS = POOL.allowed() or [DEFAULT_MODEL]
TIER_INFO = "the PCA tiers are calibrated once per model, in the background"
PREPARATION_TICK_SECONDS = 2


def tier_picker_info():
    """The tier picker says what the background preparation is doing; its timer stops once nothing is."""
    text = preparation_text()
    return gr.update(info=text or TIER_INFO), gr.Timer(active=bool(text))

LAYERS, KV_HEADS = model_shape(MODELS[0])

with gr.Blocks(title="KV Codec Studio") as demo:
    gr.Markdown(
        "# KV Codec Studio\nThe same model, twice: its native KV cache against a compressed codec cache. "
        "Every number below is measured when you press the button."
    )
    with gr.Accordion("Model and backend", open=False):
        model_name = gr.Dropdown(MODELS, value=MODELS[0], label="model")
        model_info = gr.Markdown()

    with gr.Tab("Chat"):
        session = gr.State(None, time_to_live=3600, delete_callback=end_session)  # closed tab, expired session
        with gr.Row():
            tier_name = gr.Dropdown(CODEC_TIERS, value="turbo-4", label="codec tier", scale=2, info=TIER_INFO)
            max_tokens = gr.Slider(8, LIMITS.max_new_tokens, value=min(96, LIMITS.max_new_tokens), step=8,
                                   label="max new tokens", scale=2)
            decoded_view = gr.Checkbox(
                label="keep a decoded view (opt-in; by default attention reads the stored codes)", value=False,
                scale=1,
            )
        preparing = gr.Timer(PREPARATION_TICK_SECONDS)
        preparing.tick(tier_picker_info, None, [tier_name, preparing], show_progress="hidden")
        chat_advanced = tabs.advanced.advanced_settings()
        with gr.Accordion("Long document: ask about a text, so the archive holds most of the context", open=False):
            with gr.Row():
                document = gr.Dropdown(list(DOCUMENTS), value=None, label="embedded document", scale=2)
                upload = gr.File(label="or upload a .txt / .md file", file_types=list(TEXT_FILE_TYPES), scale=1)
            gr.Markdown("The document goes before your next message (once); the conversation keeps it.")
        with gr.Accordion("Save or resume: the codec cache of this conversation as a file", open=False):
            with gr.Row():
                save_cache = gr.Button("Download the codec cache", scale=1)
                cache_file = gr.File(label="codec cache (.kvc)", interactive=False, scale=2)
            with gr.Row():
                resume_upload = gr.File(label="upload a .kvc file to continue its conversation",
                                        file_types=list(CACHE_FILE_TYPES), scale=2)
                resume = gr.Button("Resume", scale=1)
            gr.Markdown("The file holds the codec cache (its archive and raw tokens), the token ids and the "
                        "exchanges. Resuming loads the codec cache from it and re-prefills the native cache from "
                        "the saved token ids.")
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

    layer, head = tabs.inspect.build(model_name, CODEC_TIERS, LAYERS, KV_HEADS)

    ruler_state = gr.State(None)  # the Long context tab's last grid: the sweep's long-context axis
    stop_flag = gr.State(StopFlag())  # one per browser session, shared by the long-running tabs
    sweep = tabs.sweep.build(model_name, stop_flag, ruler_state, [*TIERS, *PEER_NAMES], CODEC_TIERS + INSTALLED_PEERS,
                             EXAMPLES[1])
    stops = [sweep.stop, *tabs.long_context.build(model_name, stop_flag, [*CODEC_TIERS, *PEER_NAMES], ruler_state,
                                                  (sweep.state, sweep.metric, sweep.pareto))]
    stops.append(tabs.reasoning.build(model_name, stop_flag, [*CODEC_TIERS, *BOUNDARY_CHOICES, *PEER_NAMES]))
    stops.append(tabs.memory.build(model_name, stop_flag, CODEC_TIERS))

    demo.load(model_panel, model_name, [model_info, layer, head, preparing])
    model_name.change(model_panel, model_name, [model_info, layer, head, preparing])
    chat_inputs = [message, document, upload, model_name, tier_name, max_tokens, decoded_view,
                   *chat_advanced, session]
    chat_outputs = [native_chat, codec_chat, native_stats, codec_stats, message, document, upload, session]
    turns = [
        send.click(chat_turn, chat_inputs, chat_outputs, api_name="chat"),
        message.submit(chat_turn, chat_inputs, chat_outputs, api_name=False),
    ]
    stop.click(stop_turn, session, [native_chat, codec_chat, native_stats, codec_stats], cancels=turns,
               api_name=False)
    save_cache.click(download_cache, session, cache_file, api_name="download_cache")
    resume.click(resume_chat, [resume_upload, model_name, session],
                 [native_chat, codec_chat, native_stats, codec_stats, tier_name, decoded_view,
                  chat_advanced[0], resume_upload, session], api_name="resume_cache")
    cleared = [native_chat, codec_chat, native_stats, codec_stats, session]
    clear.click(clear_chat, session, cleared, cancels=turns, api_name=False)
    for panel in (native_chat, codec_chat):  # clearing one panel clears the conversation: both stay in step
        panel.clear(clear_chat, session, cleared, cancels=turns, api_name=False)
    for button in stops:
        button.click(request_stop, stop_flag, None, queue=False, api_name=False)

keep_out_of_collections()  # what was imported and built above lives as long as the app

if __name__ == "__main__":
    PREPARATION.start(MODELS[0])  # in the background: the first visitor of a PCA tier does not wait on it alone
    demo.queue(default_concurrency_limit=2, max_size=64).launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("PORT", os.environ.get("GRADIO_SERVER_PORT", "7860"))),
        show_error=True,
    )
