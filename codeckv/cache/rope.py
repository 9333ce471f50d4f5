"""The model's rotary embedding as a press sees it: (cos, sin) at any positions, for the attention layer it scores.

A press that needs the queries before RoPE (expected attention, codeckv/presses/expected_attention.py) gets them back
from the queries codeckv's attention function sees, with the model's own rotary embedding, and carries their
statistics to the coming positions with it. `remember_rotary(model)` (called by use_codec_attention) notes, for each
attention module, the model's rotary embedding and the layer type it is called with (Gemma-3 keeps one per type);
`rope_at(module)` then gives the function positions (P,) -> (cos, sin) (P, R) float32, or None for a model whose
positions are not rotary (absolute position embeddings): its queries never rotate. Most families rotate channel i
with channel i + R/2 (transformers' rotate_half); Llama 4 rotates neighbours (2i, 2i + 1) by a complex product, and
its function says so (`interleaved`), with (cos, sin) given per pair, repeated as rotate_half lays them out.
"""

from __future__ import annotations

import inspect
import weakref

import torch

_ROTARY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # attention module -> (rotary module, layer type)


def _rotary_embedding(model: torch.nn.Module) -> torch.nn.Module | None:
    """The decoder's rotary embedding module (model.model.rotary_emb, or its language model's), None without one."""
    inner = getattr(model, "model", model)
    for holder in (inner, getattr(inner, "language_model", None)):
        rotary = getattr(holder, "rotary_emb", None) if holder is not None else None
        if isinstance(rotary, torch.nn.Module):
            return rotary
    return None


def remember_rotary(model: torch.nn.Module) -> None:
    """Note the rotary embedding of each attention module of `model` (one with a layer_idx) for rope_at."""
    rotary = _rotary_embedding(model)
    if rotary is None:
        return
    takes_type = "layer_type" in inspect.signature(rotary.forward).parameters
    types = getattr(model.config.get_text_config(decoder=True), "layer_types", None)
    for index, module in attention_modules(model).items():
        layer_type = types[index] if takes_type and types and index < len(types) else None
        _ROTARY[module] = (rotary, layer_type)


def attention_modules(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """{layer index: attention module} of `model` (modules with an integer layer_idx and a head_dim)."""
    return {module.layer_idx: module for module in model.modules()
            if isinstance(getattr(module, "layer_idx", None), int) and hasattr(module, "head_dim")}


class RotaryAt:
    """positions (P,) -> (cos, sin) (P, R) float32 of one layer's rotary embedding; `interleaved`: the model rotates
    neighbouring channels (2i, 2i + 1) rather than (i, i + R/2)."""

    def __init__(self, rotary: torch.nn.Module, layer_type: str | None) -> None:
        self.rotary, self.layer_type = rotary, layer_type
        self.interleaved = torch.is_complex(self._raw(torch.zeros(1, dtype=torch.long))[0])

    def _raw(self, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        probe = torch.zeros(1, dtype=torch.float32, device=positions.device)
        ids = positions[None].to(torch.long)
        out = self.rotary(probe, ids) if self.layer_type is None else self.rotary(probe, ids, self.layer_type)
        return out if isinstance(out, tuple) else (out,)

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self._raw(positions)
        if self.interleaved:  # Llama 4's freqs_cis (1, P, R/2): one angle per pair of neighbours
            angles = out[0][0].reshape(len(positions), -1)
            cos, sin = angles.real.float(), angles.imag.float()
            return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
        cos, sin = out
        return cos[0].float(), sin[0].float()


def rope_at(module: torch.nn.Module) -> RotaryAt | None:
    """The (cos, sin) the model rotates `module`'s queries and keys with, at any positions (RotaryAt); None where the
    model has no rotary embedding noted (remember_rotary)."""
    noted = _ROTARY.get(module)
    return RotaryAt(*noted) if noted is not None else None
