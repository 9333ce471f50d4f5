"""The sequence decode_attention reads: Coded spans (an archive as its codecs stored it) and Raw spans, in order.

    segments = [Raw(sink_k, sink_v), Coded(key_codec, k_enc, value_codec, v_enc), Raw(tail_k, tail_v)]
    hkv, dv = geometry(segments)          # KV heads and value head_dim, shared by every segment
    value_rotation(segments, dv, device)  # Q of the values' domain (a rotated value codec), or None
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codeckv.codecs.layout import Codec, Encoded, RowLayout

from .layout import layout_of, rotation


@dataclass(frozen=True)
class Coded:
    """An archived span: keys and values exactly as their codecs stored them."""

    key_codec: Codec
    keys: Encoded  # shape (B, Hkv, n, D)
    value_codec: Codec
    values: Encoded  # shape (B, Hkv, n, Dv)

    @property
    def tokens(self) -> int:
        return self.keys.shape[2]


@dataclass(frozen=True)
class Raw:
    """A span of full-precision tokens."""

    keys: torch.Tensor  # (B, Hkv, n, D)
    values: torch.Tensor  # (B, Hkv, n, Dv)

    @property
    def tokens(self) -> int:
        return self.keys.shape[2]


Segment = Coded | Raw


def geometry(segments: list[Segment]) -> tuple[int, int]:
    """(KV heads, value head_dim) shared by every segment."""
    if not segments:
        raise ValueError("decode_attention: expected at least one segment (Coded or Raw), got none")
    return segments[0].keys.shape[1], segments[0].values.shape[-1]  # tensors and Encoded both carry .shape


def value_rotation(segments: list[Segment], dv: int, device: torch.device) -> torch.Tensor | None:
    """Q of the values' domain (the coded values' rotation), shared by every Coded segment; None if unrotated.

    A value codec without a row layout is read as decoded tokens: unrotated.
    """
    layouts = [layout_of(s.value_codec) for s in segments if isinstance(s, Coded)]
    rotations = {layout.rotation if isinstance(layout, RowLayout) else None for layout in layouts}
    if len(rotations) > 1:
        raise ValueError(f"decode_attention: Coded segments disagree on the value rotation ({rotations})")
    rotated = [layout for layout in layouts if isinstance(layout, RowLayout) and layout.rotation is not None]
    return rotation(rotated[0], dv, device) if rotated else None
