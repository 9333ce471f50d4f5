"""What users and API callers hand the app, read and checked at the edge, before any loader, loop or allocation.

    text = user_text(message)                                  # a real text: not empty, valid Unicode, bounded
    n = whole(value, "max new tokens", 1, 256)                 # a whole number in range: no silent truncation
    tier = tier_from_knobs("turbo-4", False, 8, 0, "4", ...)  # a preset, or a custom tier from the Advanced knobs
    tier = tier_from_knobs(..., per_layer="0-3:int8")          # ... with its own tier on some layers (schedule.py)
    fits_model(tier, loaded.info)                              # its codecs, windows and layers fit this model
    text = read_text_file("notes.md"); text = document_text("Python reference: the try statement (≈2.0k tokens)")
    path = saved_cache_file(upload, max_bytes)                 # an uploaded .kvc cache file, bounded

Every check raises ValueError with the allowed values in the message; the app shows it as it is.
"""

from __future__ import annotations

import math
from pathlib import Path
from pydoc_data.topics import topics

import torch

from codeckv.cache.layers import MIN_ARCHIVE_TOKENS, CodecLayer
from codeckv.cache.schedule import check_layers, parse_layers, schedule, tiers_used
from codeckv.codecs.bitpack import ALLOWED_BITS
from codeckv.codecs.dct import MAX_BLOCK
from codeckv.custom_tier import custom_tier
from codeckv.loaded import ModelInfo
from codeckv.measure.peers import PEER_NAMES, Peer, run_for
from codeckv.serve.limits import Limits
from codeckv.tiers import MAX_RAW_TOKENS, TIERS, Tier, get_tier

MAX_GROUP = 256  # quantization group (channels or tokens)
TEXT_FILE_TYPES = (".txt", ".md")
CACHE_FILE_TYPES = (".kvc",)  # a saved codec cache (cache/saved_format.py)
INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e"), None)  # zero-width, soft hyphen
BITS_CHOICES = ("none", *map(str, ALLOWED_BITS))

DOCUMENTS = {  # title -> key of an embedded Python reference topic of 1-3k tokens (the corpus, corpus.py)
    "Python reference: the try statement (≈2.0k tokens)": "try",
    "Python reference: the import system (≈2.1k tokens)": "import",
    "Python reference: execution model (≈2.2k tokens)": "execmodel",
    "Python reference: function definitions (≈1.5k tokens)": "function",
}


def user_text(value, name: str = "the prompt", max_chars: int | None = None) -> str:
    """A text with something visible in it, valid Unicode (UTF-8 encodable) and at most max_chars long.

    max_chars: default Limits.from_env().max_text_chars (codeckv/serve/limits.py).
    """
    max_chars = max_chars or Limits.from_env().max_text_chars
    if not isinstance(value, str):
        raise ValueError(f"{name} must be text, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{name} has an invalid character at position {err.start} (a lone surrogate): "
                         "remove it and try again") from None
    if not value.translate(INVISIBLE).strip():
        raise ValueError(f"{name} is empty: type something first")
    if len(value) > max_chars:
        raise ValueError(f"{name} has {len(value):,} characters (allowed: at most {max_chars:,})")
    return value


def whole(value, name: str, lo: int, hi: int) -> int:
    """A whole number in lo..hi: an int, or a float with no fraction (what a number box sends)."""
    integral = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer())
    if isinstance(value, bool) or not integral:
        raise ValueError(f"{name}={value!r} must be a whole number (allowed: {lo}..{hi})")
    if not lo <= int(value) <= hi:
        raise ValueError(f"{name}={int(value)} is out of range (allowed: {lo}..{hi})")
    return int(value)


def one_of(value, name: str, allowed) -> str:
    """One of the allowed choices (a radio button or a dropdown)."""
    allowed = list(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name}={value!r} is not a choice here (allowed: {', '.join(map(str, allowed))})")
    return value


def chosen_tiers(values, name: str = "tiers", allow_native: bool = True, peers: bool = False,
                 also: tuple[str, ...] = ()) -> list[Tier | Peer]:
    """The Tiers (and, with `peers`, the peers: transformers' and llama.cpp's, codeckv/measure/peers.py; and the
    names in `also`, such as a boundary tier turbo-3-skip2) of a non-empty list of distinct names."""
    allowed = [t for t in TIERS if allow_native or not TIERS[t].is_native] + (PEER_NAMES if peers else []) + list(also)
    if not isinstance(values, list | tuple) or not values:
        raise ValueError(f"choose at least one of the {name} (allowed: {', '.join(allowed)})")
    names = [one_of(v, name, allowed) for v in values]
    if len(set(names)) != len(names):
        raise ValueError(f"{name}: a tier is listed twice ({', '.join(names)})")
    return [run_for(n) for n in names]


def tier_from_knobs(name, custom, block_size, k, bits, value_bits, group, rotation, keep_first, keep_recent,
                    per_layer: str = "") -> Tier:
    """The chosen preset, or a custom tier from the Advanced knobs, every knob checked with its allowed values.

    per_layer: the Advanced panel's per-layer text ("0-3:int8, 29:turbo-3", bounded): those layers get those preset
    tiers, the others the chosen one (codeckv/cache/schedule.py); fits_model checks the layers against the model.
    """
    overrides = parse_layers(per_layer if per_layer is not None else "")
    return schedule(_knob_tier(name, custom, block_size, k, bits, value_bits, group, rotation, keep_first,
                               keep_recent), overrides)


def _knob_tier(name, custom, block_size, k, bits, value_bits, group, rotation, keep_first, keep_recent) -> Tier:
    """The chosen preset, or the custom tier of the Advanced knobs."""
    if not custom:
        return get_tier(one_of(name, "tier", TIERS))
    block_size = whole(block_size, "DCT block size", 1, MAX_BLOCK)
    k = whole(k, "k frequencies kept", 0, block_size)
    bits = one_of(bits, "key bits", BITS_CHOICES)
    value_bits = one_of(value_bits if value_bits is not None else "same", "value bits", ("same", *BITS_CHOICES[1:]))
    return custom_tier(
        block_size=block_size,
        k=k or None,
        bits=None if bits == "none" else int(bits),
        value_bits=None if value_bits == "same" else int(value_bits),
        group=whole(group, "quant group", 1, MAX_GROUP),
        rotation=bool(rotation),
        lloyd_max=bool(rotation and bits != "none"),
        keep_first=whole(keep_first, "keep_first", 0, MAX_RAW_TOKENS),
        keep_recent=whole(keep_recent, "keep_recent", 0, MAX_RAW_TOKENS),
    )


def fits_model(tier: Tier, info: ModelInfo) -> Tier:
    """`tier` if its codecs encode this model's heads, its raw windows leave something to archive and, for a
    per-layer schedule, every layer it names is one of this model's full-attention layers."""
    if tier.per_layer:
        check_layers(tier, info.layer_types)
        for plain in tiers_used(tier):
            fits_model(plain, info)
        return tier
    if tier.is_native:
        return tier
    unit = MIN_ARCHIVE_TOKENS if tier.joint else CodecLayer(tier).unit
    room = info.max_context - unit
    if tier.keep_first + tier.keep_recent > room:
        raise ValueError(
            f"keep_first + keep_recent = {tier.keep_first + tier.keep_recent} raw tokens leave nothing to archive "
            f"within {info.name}'s context of {info.max_context} tokens (allowed: at most {room} together)"
        )
    if tier.joint:
        return tier  # a PCA tier is calibrated on the model itself (codeckv/cache/calibration.py)
    probe = torch.zeros(1, 1, unit, info.head_dim)
    for side, codec in (("keys", tier.key), ("values", tier.value)):
        try:
            codec.encode(probe)
        except ValueError as err:
            raise ValueError(f"{tier.name} cannot encode {info.name}'s {side} "
                             f"(head_dim {info.head_dim}): {err}") from None
    return tier


def document_text(title: str) -> str:
    """The text of an embedded document, or a ValueError listing the titles."""
    return topics[DOCUMENTS[one_of(title, "document", DOCUMENTS)]]


def with_document(message: str, title: str | None = None, path: str | Path | None = None) -> tuple[str, str]:
    """(what the model reads, what the chat shows): an uploaded file or an embedded document, then the message."""
    if path:
        text, name = read_text_file(path), Path(path).name
    elif title:
        text, name = document_text(title), title
    else:
        return message, message
    return f"{text.strip()}\n\n{message}", f"[document: {name}, {len(text):,} characters]\n\n{message}"


def read_text_file(path: str | Path, max_chars: int | None = None) -> str:
    """A .txt / .md file as text: UTF-8, at most max_chars characters, else a ValueError that says why."""
    max_chars = max_chars or Limits.from_env().max_text_chars
    path = Path(path)
    if path.suffix.lower() not in TEXT_FILE_TYPES:
        raise ValueError(f"{path.name}: only text files can be read (allowed: {', '.join(TEXT_FILE_TYPES)})")
    if path.stat().st_size > 4 * max_chars:  # a UTF-8 character takes at most 4 bytes
        raise ValueError(f"{path.name} has more than {max_chars:,} characters: use a shorter text")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path.name} is not UTF-8 text (byte {err.start} cannot be decoded)") from None
    return user_text(text, path.name, max_chars)


def saved_cache_file(path, max_bytes: int) -> Path:
    """An uploaded cache file: a .kvc path of at most max_bytes (its content is checked by codeckv.cache.saved_load)."""
    if not path:
        raise ValueError(f"upload a codec cache file first (allowed: {', '.join(CACHE_FILE_TYPES)}, downloaded "
                         "from the Chat)")
    if not isinstance(path, str | Path):
        raise ValueError(f"the cache file must be a path, got {type(path).__name__}")
    path = Path(path)
    if path.suffix.lower() not in CACHE_FILE_TYPES:
        raise ValueError(f"{path.name}: not a codec cache file (allowed: {', '.join(CACHE_FILE_TYPES)})")
    if not path.is_file():
        raise ValueError(f"{path.name}: the upload did not arrive, upload it again")
    if path.stat().st_size > max_bytes:
        raise ValueError(f"{path.name} is {path.stat().st_size:,} bytes, more than the {max_bytes:,} allowed here")
    return path


def checked_chat(message, document, upload, tier_name, max_new_tokens, advanced, limits: Limits
                ) -> tuple[str, str, Tier, int]:
    """A chat turn's inputs, checked and bounded: (the user's text with any document, what the panel shows, the tier,
    the new-token count)."""
    text = user_text(message)
    max_new_tokens = whole(max_new_tokens, "max new tokens", 1, limits.max_new_tokens)
    tier = tier_from_knobs(tier_name, *advanced)
    user, shown = with_document(text, one_of(document, "document", DOCUMENTS) if document else None, upload)
    return user, shown, tier, max_new_tokens
