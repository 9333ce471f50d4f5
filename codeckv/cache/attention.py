"""Materialization-free codec attention: the attention function that reads a CodedLayer's stored codes.

    cache = make_cache(model.config, "jpeg-k8-int8", materialization_free=True)    # codeckv.cache
    use_codec_attention(model)          # the "codeckv" attention function (codeckv.load_model does this)
    model.generate(input_ids, cache=cache, max_new_tokens=64)

A CodedLayer (codeckv/cache/coded_layer.py) returns shape-only "meta" tensors tagged with itself;
`codec_attention`, registered in transformers' AttentionInterface, recognizes the tag and runs
kernels.decode_attention on the layer's segments (Triton on CUDA, the chunked torch reference
elsewhere), then archives what the new tokens completed (so a prefill chunk is raw in one layer at a
time, not in every layer until the next forward). Untagged keys (native layers, a materialized CodecLayer) go to
transformers' SDPA unchanged, so a model routed here attends exactly as with SDPA on any other cache. Only a model
that has an SDPA path is routed here: one whose attention SDPA cannot compute (Gemma-2's softcapped scores,
gpt-oss's learned sinks) keeps its own, and its caches a decoded view.
A layer whose tier has a press (codeckv/presses) evicts from each prefill chunk here, right after the chunk's
attention read it (CodecLayer.press: the chunk's queries score its tokens).
A StackedCache (codeckv/cache/stacked.py) tags its keys with its members' outputs: each member's rows of
the batch attend to that member's keys alone, by the same rules.
Inside `with captured_queries() as queries:` every attention call of this thread also records its queries, by layer
(queries[layer_idx] = (B, Hq, T, D) after RoPE): what a press reads, so that one native prefill can serve every
press tier (codeckv/measure/shared_prefill.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from codeckv.cache.coded_layer import TAG
from codeckv.cache.pressed_layer import PRESS_TAG
from codeckv.cache.rope import remember_rotary, rope_at
from codeckv.cache.stacked import CLOCK_TAG, STACK_TAG

ATTENTION = "codeckv"  # the attn_implementation name
_capture = threading.local()  # .queries: {layer index: queries} while a thread captures them (captured_queries)


@contextmanager
def captured_queries() -> Iterator[dict[int, torch.Tensor]]:
    """{layer index: (B, Hq, T, D) queries} of every attention call this thread makes inside the block (the last
    call's, per layer)."""
    outer, _capture.queries = getattr(_capture, "queries", None), {}
    try:
        yield _capture.queries
    finally:
        _capture.queries = outer


def codec_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: stored codes for a CodedLayer's tagged keys, SDPA for anything else."""
    recording = getattr(_capture, "queries", None)
    if recording is not None:  # captured_queries
        recording[getattr(module, "layer_idx", None)] = query
    members = getattr(key, STACK_TAG, None)
    if members is not None:
        return _stacked_attention(module, query, members, getattr(key, CLOCK_TAG), attention_mask, dropout, scaling,
                                  **kwargs)
    layer = getattr(key, TAG, None)
    if layer is None:
        if key.is_meta:  # a CodedLayer's shapes that the model transformed before attention (e.g. MLA's expansion)
            raise ValueError("codeckv attention: this model transforms the cached keys before attention, so attention "
                             "cannot read their codes (allowed: make_cache(..., materialization_free=False))")
        out = sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
        presser = getattr(key, PRESS_TAG, None)
        if presser is not None:  # a codec layer's view of a prefill chunk its press evicts from, now it was read
            presser.press(query, rope_at(module))
        return out
    if dropout:
        raise ValueError("codeckv attention: dropout is not supported on the stored codes (allowed: eval mode, or "
                         "make_cache(..., materialization_free=None or False), a decoded view)")
    if not layer.archive_k.tokens:  # nothing archived yet (a first prefill): plain SDPA on the raw tokens
        keys, values = layer.raw()
        out = sdpa_attention_forward(module, query, keys, values, attention_mask, dropout, scaling, **kwargs)[0]
    else:
        out = layer.attend(query, attention_mask, scaling).transpose(1, 2).contiguous()  # (B, T, Hq, Dv)
    if layer._pressable:  # its press evicts from the prefill chunk just read, before anything of it is archived
        layer.press(query, rope_at(module))
    layer.flush()  # archive what the new tokens completed now: a forward holds one layer's raw chunk, not all
    return out, None


def _stacked_attention(module, query, members, member_seconds: list[float], attention_mask, dropout, scaling,
                       **kwargs) -> tuple[torch.Tensor, None]:
    """A StackedLayer's step: each member's rows of `query` attend to that member's (keys, values) alone, the time
    each takes added to its member_seconds (cache/stacked.py)."""
    rows = query.shape[0] // len(members)
    outputs = []
    for index, (keys, values) in enumerate(members):
        start = time.perf_counter()
        part = slice(index * rows, (index + 1) * rows)
        mask = attention_mask
        if mask is not None and mask.shape[0] > 1:
            mask = mask[part]
        outputs.append(codec_attention(module, query[part], keys, values, mask, dropout, scaling, **kwargs)[0])
        member_seconds[index] += time.perf_counter() - start
    return torch.cat(outputs), None


def register() -> None:
    """Register "codeckv" in transformers' attention and mask interfaces (idempotent)."""
    AttentionInterface.register(ATTENTION, codec_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def use_codec_attention(model) -> None:
    """Make `model` attend through codec_attention (safe for any cache: non-codec layers still use SDPA).

    A model without an SDPA path (Gemma-2's softcapped scores, gpt-oss's learned sinks) keeps its own attention:
    codec caches then hold a decoded view for it (reasons.codes_reason).
    """
    if model.config._attn_implementation == ATTENTION or not getattr(model, "_supports_sdpa", True):
        return
    register()
    remember_rotary(model)  # for a press that needs the queries before RoPE (codeckv/cache/rope.py)
    model.set_attn_implementation(ATTENTION)
