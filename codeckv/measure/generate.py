"""Greedy decoding as a token stream, with the timings the measurements need.

A hand-written loop rather than `model.generate` so that callers can interleave two
runs (native and codec) token by token and time prefill and every decode step:

    for step in greedy_stream(model, input_ids, cache, max_new_tokens=64, stop_ids={2}):
        print(step.token_id, step.seconds)

Every forward continues the cache (positions follow what it holds) and computes the logits of
the last position only (`logits_to_keep=1`): a long prompt never materializes (T, vocab) logits.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import Cache, PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class Step:
    """One generated token: the prefill step has index 0."""

    index: int
    token_id: int
    seconds: float  # wall time of the forward that produced this token (prefill for index 0)
    logits: torch.Tensor  # (vocab,) fp32 logits that chose this token


@torch.inference_mode()
def greedy_stream(
    model: PreTrainedModel,
    input_ids: torch.Tensor,  # (1, T)
    cache: Cache,
    max_new_tokens: int,
    stop_ids: set[int] | frozenset[int] = frozenset(),
) -> Iterator[Step]:
    """Prefill `input_ids` through `cache` (after what it holds), then feed back the argmax token one at a time."""
    next_input = input_ids
    for index in range(max_new_tokens):
        start = time.perf_counter()
        logits = next_logits(model, next_input, cache)[0]
        token_id = int(logits.argmax())
        _sync(input_ids.device)
        yield Step(index, token_id, time.perf_counter() - start, logits)
        if token_id in stop_ids:
            return
        next_input = torch.tensor([[token_id]], device=input_ids.device)


@torch.inference_mode()
def next_logits(model: PreTrainedModel, ids: torch.Tensor, cache: Cache) -> torch.Tensor:
    """Feed ids (B, T) after what `cache` holds; fp32 logits of the last position (B, vocab)."""
    return model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1].float()


def stop_token_ids(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> frozenset[int]:
    """Token ids that end a reply: EOS, the generation config's EOS, and the chat template's end-of-turn token."""
    ids = {tokenizer.eos_token_id}
    configured = model.generation_config.eos_token_id
    ids.update(configured if isinstance(configured, list) else [configured])
    ids.add(_end_of_turn_id(tokenizer))
    return frozenset(i for i in ids if i is not None)


def _end_of_turn_id(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The special token the chat template writes right after an assistant reply (<|im_end|>, <end_of_turn>)."""
    if not tokenizer.chat_template:
        return None
    marker = "codeckv-end-of-reply-marker"
    turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": marker}]
    after = tokenizer.apply_chat_template(turn, tokenize=False).split(marker)[-1]
    ids = tokenizer(after, add_special_tokens=False).input_ids
    return ids[0] if ids and ids[0] in tokenizer.all_special_ids else None


def chat_input_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict], device: torch.device) -> torch.Tensor:
    """Apply the model's chat template (with the assistant prompt) -> (1, T) ids."""
    if tokenizer.chat_template:
        encoded = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        ids = encoded["input_ids"]
    else:  # a base model: plain concatenation of the turns
        text = "\n\n".join(m["content"] for m in messages)
        ids = tokenizer(text, return_tensors="pt").input_ids
    return ids.to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
