"""A codec configured for rows of a given head_dim: what a model whose heads are not a multiple of 32 wide needs.

    codec = for_head_dim(GroupQuant(bits=8, group=32), 80)      # GroupQuant(bits=8, group=16)

The presets quantize per-token groups of 32 channels, which fit head_dim 64, 128 or 256 but not phi-2's 80, a
latent of 16 channels or MLA's 192 + 64. A per-token group (an FP4 block) that does not divide head_dim shrinks to
their greatest common divisor (80 -> 16); every other field stays, and so does a per-channel group (it spans tokens,
not channels).
A wrapping codec (Rotation, DCT) fits what it wraps; Rotation itself takes any head_dim (codecs/rotation.py). A codec
with a `head_dim` field (vLLM's TurboQuant values: one group a vector) gets the model's.
The cache fits each layer's tier to the states it first sees (codeckv/cache/layers.py), so the bytes a model's
cache stores are always those of the codec that coded them, and footprint() reports them as they are.
"""

from __future__ import annotations

import dataclasses
import math

from codeckv.codecs.base import Codec

CHANNEL_GROUPS = ("group", "block")  # fields of a codec that cut a token's channels into groups (FP4: blocks)


def for_head_dim(codec: Codec | None, head_dim: int) -> Codec | None:
    """`codec` with every per-token quantization group dividing head_dim (module docstring); None stays None."""
    if codec is None or not dataclasses.is_dataclass(codec):
        return codec
    changes = {f.name: for_head_dim(getattr(codec, f.name), head_dim) for f in dataclasses.fields(codec)
               if isinstance(getattr(codec, f.name), Codec)}
    for name in CHANNEL_GROUPS:
        size = getattr(codec, name, None)
        if isinstance(size, int) and not getattr(codec, "per_channel", False) and head_dim % size:
            changes[name] = math.gcd(size, head_dim)
    if isinstance(getattr(codec, "head_dim", None), int):  # a codec whose group is the whole row (TQValues)
        changes["head_dim"] = head_dim
    changed = {name: value for name, value in changes.items() if value != getattr(codec, name)}
    return dataclasses.replace(codec, **changed) if changed else codec
