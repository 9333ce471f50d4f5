"""The Advanced panel's tier: `custom_tier` builds one from its knobs (DCT frequencies, bits, groups, rotation,
Lloyd-Max levels, per-channel keys, raw sinks and window); impossible settings raise ValueError with what is allowed.

    tier = custom_tier(k=4, bits=8, value_bits=4, rotation=True, keep_recent=32)

The presets live in codeckv/tiers.py; a custom tier is a Tier like them, built from the same codecs.
"""

from __future__ import annotations

from codeckv.codecs.base import Codec
from codeckv.codecs.bitpack import ALLOWED_BITS
from codeckv.codecs.dct import DCT
from codeckv.codecs.lloyd_max import LloydMaxQuant
from codeckv.codecs.quant import GroupQuant
from codeckv.codecs.rotation import Rotation
from codeckv.tiers import Tier


def _quantizer(bits: int, group: int, lloyd_max: bool) -> Codec:
    """A per-token quantizer: Lloyd-Max levels or a min/max grid."""
    if lloyd_max:
        return LloydMaxQuant(bits=bits, group=group)
    return GroupQuant(bits=bits, group=group)


def _check_bits(value: int | None, name: str) -> None:
    """Raise ValueError unless value is None or a supported bit width."""
    if value is not None and (isinstance(value, bool) or value not in ALLOWED_BITS):
        raise ValueError(f"custom_tier: {name}={value!r} is not supported (allowed: {(None, *ALLOWED_BITS)})")


def custom_tier(
    block_size: int = 8,
    k: int | None = None,
    bits: int | None = None,
    group: int = 32,
    rotation: bool = False,
    keep_first: int = 0,
    keep_recent: int = 0,
    value_bits: int | None = None,
    lloyd_max: bool = False,
    per_channel_keys: bool = False,
    name: str = "custom",
) -> Tier:
    """Build a tier from the "Advanced" knobs; impossible settings raise ValueError.

    k: DCT frequencies kept per block of block_size tokens (None = no DCT).
    bits: key bits (None = no quantization); value_bits: value bits (None = bits).
    group: quantization group size; rotation: random Hadamard before quantizing;
    lloyd_max: Gaussian Lloyd-Max levels instead of a min/max grid;
    per_channel_keys: keys in per-channel groups of `group` tokens, min/max grid,
    not rotated (KIVI). With DCT, the quantizer encodes the DCT coefficients.
    keep_first / keep_recent: sink tokens and recent window kept at full precision.
    """
    _check_bits(bits, "bits")
    _check_bits(value_bits, "value_bits")
    if bits is None:
        needs_bits = {
            "value_bits": value_bits is not None,
            "rotation": rotation,
            "lloyd_max": lloyd_max,
            "per_channel_keys": per_channel_keys,
        }
        for option, on in needs_bits.items():
            if on:
                raise ValueError(f"custom_tier: {option} needs quantization (allowed bits: {ALLOWED_BITS})")
    value_bits = bits if value_bits is None else value_bits

    key_codec: Codec | None = None
    value_codec: Codec | None = None
    parts = [f"DCT r={block_size} k={k}"] if k is not None else []
    if bits is not None:
        levels = "Lloyd-Max" if lloyd_max else "min/max"
        rotated = "rotated " if rotation else ""
        value_codec = _quantizer(value_bits, group, lloyd_max)
        if per_channel_keys:
            key_codec = GroupQuant(bits=bits, group=group, per_channel=True)
            keys = f"{bits}-bit per channel ({group} tokens)"
        else:
            key_codec = _quantizer(bits, group, lloyd_max)
            keys = f"{rotated}{bits}-bit {levels}"
        if rotation:
            value_codec = Rotation(inner=value_codec)
            key_codec = key_codec if per_channel_keys else Rotation(inner=key_codec)
        parts.append(f"K {keys}, V {rotated}{value_bits}-bit {levels} (group {group})")
    if k is not None:
        key_codec = DCT(block_size=block_size, k=k, coeffs=key_codec)
        value_codec = DCT(block_size=block_size, k=k, coeffs=value_codec)
    if keep_first or keep_recent:
        parts.append(f"{keep_first} sink + {keep_recent} recent tokens raw")
    description = ", ".join(parts) if parts else "No compression"
    return Tier(name, description, key=key_codec, value=value_codec, keep_first=keep_first, keep_recent=keep_recent)
