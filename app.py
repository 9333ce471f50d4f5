"""KV Codec Studio — Gradio layout and event wiring only; every number comes from codeckv."""

import os

import gradio as gr
from transformers import DynamicCache

from codeckv.generate import chat_input_ids, greedy_stream, stop_token_ids
from codeckv.models import load_model

MAX_NEW_TOKENS = 128
LOADED = load_model(os.environ.get("CODECKV_MODEL"))


def chat(message: str, history: list[dict]):
    """Stream the native-cache answer to `message`, multi-turn through the chat template."""
    if not message.strip():
        raise gr.Error("Type a message first.")
    messages = [{"role": m["role"], "content": m["content"]} for m in history] + [{"role": "user", "content": message}]
    ids = chat_input_ids(LOADED.tokenizer, messages, LOADED.model.device)
    if ids.shape[1] + MAX_NEW_TOKENS > LOADED.info.max_context:
        raise gr.Error(f"The conversation is {ids.shape[1]} tokens; the model's context is {LOADED.info.max_context}.")
    cache = DynamicCache(config=LOADED.model.config)
    tokens = []
    stops = stop_token_ids(LOADED.tokenizer, LOADED.model)
    for step in greedy_stream(LOADED.model, ids, cache, MAX_NEW_TOKENS, stops):
        tokens.append(step.token_id)
        yield LOADED.tokenizer.decode(tokens, skip_special_tokens=True)


def model_info_markdown() -> str:
    info = LOADED.info
    return (
        f"**{info.name}** ({info.source}, loaded in {info.load_seconds} s) · {len(info.layer_types)} layers "
        f"({info.codec_layers} full attention) · {info.num_kv_heads} KV heads × head_dim {info.head_dim} · "
        f"{info.dtype} on {info.device} · KV bytes/token (bf16): {info.kv_bytes_per_token_bf16:,}"
    )


with gr.Blocks(title="KV Codec Studio") as demo:
    gr.Markdown("# KV Codec Studio")
    gr.Markdown(model_info_markdown())
    gr.ChatInterface(chat, examples=["What is the capital of France?"])

if __name__ == "__main__":
    demo.queue(default_concurrency_limit=2).launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("PORT", os.environ.get("GRADIO_SERVER_PORT", 7860))),
    )
