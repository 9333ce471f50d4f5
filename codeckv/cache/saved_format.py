"""The .kvc file: one safetensors file (tensors only, no pickle) with a versioned JSON header, and its writer.

    cache.save("chat.kvc", token_ids, loaded)      # CodecCache.save -> save_cache: the bytes written
    saved = load_cache("chat.kvc", loaded)          # cache/saved_load.py: SavedCache (.cache at rest, .token_ids)

Format "codeckv-cache", version 3 (version 2, whose digest left the header out, and version 1, before per-layer
schedules and PCA rate control, still load when they carry no application data: their `extra` could have been
changed unseen; version 1's PCA caches were coded with calibrations that no longer exist, which the calibration
digest refuses). The safetensors metadata holds one key, "codeckv", a JSON object:

    format, version       "codeckv-cache", 2
    tier                  the tier as data, enough to rebuild it exactly (presets, custom_tier, keep_first /
                          keep_recent overrides): name, description, keep_first, keep_recent, max_rel_error
                          (null = unbounded), key and value codecs as {"codec": class name, field: value, ...}
                          (a wrapped codec nested in its field), or joint (the JointPCA fields), and per_layer:
                          [[layer index, tier], ...], the per-layer schedule (codeckv/cache/schedule.py; [] = none)
    materialization_free  the mode the cache ran in: true (attention on the codes), false (a decoded view), or
                          null (a schedule whose layers differ: the codes wherever the layer's tier allows)
    short_view            true when its codes layers chose a short context's decoded view by themselves (the
                          default path, codeckv/cache/coded_layer.py); absent = false
    model                 name (null when not given), geometry (per layer: "codec" (with its "window" where it
                          slides), "sliding" and its window, or "native" (a full-attention layer a schedule or a
                          tier's boundary leaves native); KV heads, head_dim, dtype), calibration (PCA tiers:
                          sha256 of every layer's coder; else null)
    tokens, batch         tokens every layer holds; rows of the batch
    layers                per model layer: {"kind": "codec", "length", "archived_upto", "raw_until"} (and "first",
                          the first position a sliding codec layer holds) or {"kind": "sliding",
                          "cumulative_length"} or {"kind": "native", "length"}; length: tokens seen; raw_until
                          (cache/layers.py, "Raw until N"):
                          tokens the layer holds raw before it archives, null = never; absent (files written
                          before it) = 0, as those caches archived from the first unit
    splits                variable-length tensors (PCA streams): their length per layer
    sha256                of the header without this field (canonical JSON), then of every tensor (name and
                          bytes, in name order); version 1 and 2: of the tensors only
    extra                 an application's own JSON (the Chat: the conversation's exchanges), or null

Tensors: "token_ids" (B, T) int32, and per layer kind each tensor a layer exports (CodecLayer.export_state: the
raw sinks and tail, the archive's code tensors or PCA streams, their lengths and rungs; a sliding layer: its
window's keys and values; a native layer: its keys and values) stacked over the layers of that kind on a new first
axis, as "codec.<name>" / "sliding.<name>" / "native.<name>" (a 1-D variable-length one, concatenated). The codec
layers of a schedule are stacked per tier and window, in the order they first appear in the model's layers:
"codec.<name>" for the first, "codec1.<name>", "codec2.<name>", ... So a file is the cache's held bytes at rest
(archive + raw tokens) plus the token ids and a header of a few KiB (`python -m codeckv saved-size` measures it per
tier).

Loading checks everything it can before it reads a tensor: the file size (max_bytes), the safetensors header
(every offset inside the file, nothing missing at its end), the JSON, format and version, the tier (rebuilt from
data, never imported by name), the model (geometry and name), the calibration of a PCA tier, every count, and
every tensor's name, dtype and shape against what the layers of this tier expect; then the sha256 of what it
read. Any failure raises SavedCacheError (a ValueError) with the reason and what is allowed; nothing is loaded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import safetensors
import safetensors.torch
import torch
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer, LinearAttentionCacheLayerMixin

from codeckv.cache.layers import CodecLayer
from codeckv.cache.pca_layer import PCALayer
from codeckv.codecs import DCT, FP4, FP8, Cast, Delta, GroupQuant, LloydMaxQuant, Rotation
from codeckv.codecs.pca import JointPCA
from codeckv.codecs.vllm_tq_keys import TQKeys
from codeckv.codecs.vllm_tq_values import TQValues
from codeckv.loaded import LoadedModel
from codeckv.tiers import Tier

FORMAT = "codeckv-cache"
VERSION = 3  # 2: per-layer schedules, PCA chunks' rate-control rungs ("rungs"); 3: the digest covers the header
READABLE_VERSIONS = (1, 2, 3)
MAX_FILE_BYTES = 512 << 20  # load_cache's default cap: an 8k-token lossless (png) cache of smollm2-135m fits
MAX_HEADER_BYTES = 8 << 20  # the safetensors JSON header (the Chat's conversation text included)
CODECS = {cls.__name__: cls for cls in (Cast, DCT, Delta, FP4, FP8, GroupQuant, LloydMaxQuant, Rotation, TQKeys,
                                        TQValues)}
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
          "F8_E8M0": torch.float8_e8m0fnu}  # the 8-bit floats of the FP8 / FP4 codecs (codecs/fp8.py, fp4.py)


class SavedCacheError(ValueError):
    """A cache file that cannot be saved or loaded here; the message says why and what is allowed."""


@dataclass
class SavedCache:
    """A loaded cache file: the cache (at rest: restore() or its next update rebuilds any view), its tokens, header."""

    cache: object  # CodecCache
    token_ids: torch.Tensor  # (B, T) int64: the tokens the cache holds, in order
    header: dict


# --- the tier as data ------------------------------------------------------------------------------------------

def codec_spec(codec) -> dict | None:
    """A codec as JSON data: {"codec": class name, field: value, ...}, a wrapped codec nested."""
    if codec is None:
        return None
    if type(codec) not in CODECS.values():
        raise SavedCacheError(f"codec {codec!r} cannot be saved (allowed: {', '.join(CODECS)})")
    spec = {"codec": type(codec).__name__}
    for f in dataclasses.fields(codec):
        value = getattr(codec, f.name)
        spec[f.name] = codec_spec(value) if type(value) in CODECS.values() else value
    return spec


def codec_from_spec(spec):
    """The codec codec_spec described (every field checked by the codec itself)."""
    if spec is None:
        return None
    if not isinstance(spec, dict) or spec.get("codec") not in CODECS:
        raise SavedCacheError(f"codec {spec!r} is not one this version can rebuild (allowed: {', '.join(CODECS)})")
    fields = {k: v for k, v in spec.items() if k != "codec"}
    for name, value in fields.items():
        if isinstance(value, dict):
            fields[name] = codec_from_spec(value)
        elif isinstance(value, list):
            fields[name] = tuple(value)
    try:
        return CODECS[spec["codec"]](**fields)
    except (TypeError, ValueError) as err:
        raise SavedCacheError(f"codec {spec['codec']} cannot be rebuilt from {fields}: {err}") from None


def tier_spec(tier: Tier) -> dict:
    """A tier as JSON data; refused (SavedCacheError) unless tier_from_spec rebuilds exactly this tier."""
    spec = {
        "name": tier.name, "description": tier.description, "keep_first": tier.keep_first,
        "keep_recent": tier.keep_recent,
        "max_rel_error": None if math.isinf(tier.max_rel_error) else tier.max_rel_error,
        "key": codec_spec(tier.key), "value": codec_spec(tier.value),
        "joint": dataclasses.asdict(tier.joint) if tier.joint is not None else None,
        "per_layer": [[index, tier_spec(layer_tier)] for index, layer_tier in tier.per_layer],
    }
    if tier_from_spec(json.loads(json.dumps(spec))) != tier:
        raise SavedCacheError(f"tier '{tier.name}' cannot be rebuilt from data exactly, so it cannot be saved "
                              "(allowed: tiers of codeckv.tiers: presets, custom_tier, pca_tier)")
    return spec


def tier_from_spec(spec) -> Tier:
    """The tier tier_spec described."""
    keys = {"name", "description", "keep_first", "keep_recent", "max_rel_error", "key", "value", "joint"}
    if not isinstance(spec, dict) or set(spec) - {"per_layer"} != keys:
        raise SavedCacheError(f"the tier in the header is not a tier of this format (allowed keys: "
                              f"{sorted(keys | {'per_layer'})})")
    joint, per_layer = spec["joint"], spec.get("per_layer", [])
    if not isinstance(per_layer, list) or not all(isinstance(e, list) and len(e) == 2 for e in per_layer):
        raise SavedCacheError("the tier's per_layer in the header is not a list of [layer index, tier] pairs")
    try:
        if joint is not None:
            joint = JointPCA(**joint) if isinstance(joint, dict) else None
            if joint is None:
                raise ValueError("joint must be an object of JointPCA fields")
        bound = math.inf if spec["max_rel_error"] is None else spec["max_rel_error"]
        return Tier(spec["name"], spec["description"], key=codec_from_spec(spec["key"]),
                    value=codec_from_spec(spec["value"]), keep_first=spec["keep_first"],
                    keep_recent=spec["keep_recent"], max_rel_error=bound, joint=joint,
                    per_layer=tuple((index, tier_from_spec(layer)) for index, layer in per_layer))
    except (TypeError, ValueError) as err:
        raise SavedCacheError(f"the tier in the header cannot be rebuilt: {err}") from None


# --- model identity --------------------------------------------------------------------------------------------

def model_and_name(source) -> tuple[object, str | None]:
    """(the transformers model, its name) of a LoadedModel or a model; (None, None) for None."""
    if source is None:
        return None, None
    if isinstance(source, LoadedModel):
        return source.model, source.info.name
    if not hasattr(source, "config"):
        raise SavedCacheError(f"{type(source).__name__} is not a model (allowed: a LoadedModel, a transformers model)")
    return source, getattr(source.config, "name_or_path", None) or None


def _kinds(cache) -> list[dict]:
    """Per layer of a CodecCache: {"kind": "codec"} (with "window": W where it slides) or {"kind": "sliding",
    "window": W}; other layers are refused."""
    kinds = []
    for index, layer in enumerate(cache.layers):
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            raise SavedCacheError(f"layer {index} keeps a linear-attention state beside its keys and values, which "
                                  "this format cannot save (allowed: models whose layers are attention only)")
        if isinstance(layer, CodecLayer):
            kinds.append({"kind": "codec"} if layer.window is None else {"kind": "codec", "window": layer.window})
        elif type(layer) is DynamicSlidingWindowLayer:
            kinds.append({"kind": "sliding", "window": layer.sliding_window})
        elif type(layer) is DynamicLayer:  # a layer the tier's schedule or boundary leaves native
            kinds.append({"kind": "native"})
        else:
            raise SavedCacheError(f"layer {index} is a {type(layer).__name__}, which this format cannot save "
                                  "(allowed: codec layers, DynamicLayer and DynamicSlidingWindowLayer)")
    return kinds


def model_geometry(model, cache) -> dict:
    """What a cache file must agree with: each layer's kind (from `cache`, built for `model`), KV heads, dims, dtype."""
    config = model.config.get_text_config(decoder=True)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {"layers": _kinds(cache), "kv_heads": config.num_key_value_heads, "head_dim": head_dim,
            "dtype": str(model.dtype).removeprefix("torch.")}


def cache_geometry(cache) -> dict:
    """The same geometry read from a cache's own tensors (what a file saved without its model records)."""
    first = next(layer for layer in cache.layers if isinstance(layer, CodecLayer))
    raw = first._raw_tokens()
    return {"layers": _kinds(cache), "kv_heads": raw.sink_keys.shape[1], "head_dim": raw.sink_keys.shape[3],
            "dtype": str(raw.sink_keys.dtype).removeprefix("torch.")}


def tensor_groups(cache) -> list[str]:
    """Per layer, the group its tensors are stacked in: "sliding", "native", or "codec", "codec1", ... by the layer's
    tier and window."""
    kinds: list = []
    groups = []
    for layer in cache.layers:
        if not isinstance(layer, CodecLayer):
            groups.append("sliding" if type(layer) is DynamicSlidingWindowLayer else "native")
            continue
        kind = (layer.tier, layer.window)
        if kind not in kinds:
            kinds.append(kind)
        position = kinds.index(kind)
        groups.append(f"codec{position or ''}")
    return groups


def _mode(cache) -> bool | None:
    """True when every codec layer attends on its codes, False when none does, None for a mix (a schedule)."""
    coded = {type(layer).__name__ == "CodedLayer" for layer in cache.layers if isinstance(layer, CodecLayer)}
    return coded.pop() if len(coded) == 1 else None


def calibration_digest(coders: list) -> str:
    """sha256 of the layer coders of a PCA cache (basis, mean, step, entropy tables), in layer order."""
    digest = hashlib.sha256()
    for coder in coders:
        for t in (coder.mean, coder.enc, coder.dec, *coder.table.state().values(), coder.rope.inv_freq):
            digest.update(_bytes(t))
        digest.update(repr((coder.step, coder.heads, coder.head_dim, coder.sink_tokens)).encode())
    return digest.hexdigest()


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def tensors_digest(tensors: dict[str, torch.Tensor], header: dict | None = None) -> str:
    """sha256 of `header` (canonical JSON, its own "sha256" left out; None: none, versions 1 and 2), then of every
    tensor, name and bytes, in name order."""
    digest = hashlib.sha256()
    if header is not None:
        fields = {key: value for key, value in header.items() if key != "sha256"}
        digest.update(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode() + b"\0")
    for name in sorted(tensors):
        digest.update(name.encode() + b"\0")
        digest.update(_bytes(tensors[name]))
    return digest.hexdigest()


# --- save ------------------------------------------------------------------------------------------------------

def save_cache(cache, path: str | Path, token_ids, model=None, extra=None) -> int:
    """Write `cache` and the (B, T) token ids it holds to `path` (format above): the file's size in bytes.

    model: a LoadedModel or a transformers model, recorded by name and checked against the cache's geometry.
    extra: JSON-serializable data of the application, stored in the header as it is.
    """
    model, name = model_and_name(model)
    ids = torch.as_tensor(token_ids)
    ids = ids.reshape(1, -1) if ids.dim() == 1 else ids
    if ids.dim() != 2 or not ids.numel() or ids.is_floating_point():
        raise SavedCacheError(f"token_ids must be (T,) or (B, T) integer ids of the tokens the cache holds, got "
                              f"{tuple(ids.shape)} {ids.dtype}")
    if not any(isinstance(layer, CodecLayer) for layer in cache.layers):
        raise SavedCacheError("nothing to save: the cache has no codec layer (allowed: a CodecCache of a tier)")
    geometry = cache_geometry(cache)
    if model is not None and model_geometry(model, cache) != geometry:
        raise SavedCacheError(f"this cache does not belong to {name or 'the given model'}: its geometry is "
                              f"{geometry}, the model's {model_geometry(model, cache)}")
    layers, groups = [], tensor_groups(cache)
    grouped, variable = {group: {} for group in groups}, set()
    for index, (layer, group) in enumerate(zip(cache.layers, groups)):
        if isinstance(layer, CodecLayer):
            if layer.padded:
                raise SavedCacheError(f"layer {index} was set up for a left-padded batch, which this format cannot "
                                      "save (allowed: rows without padding)")
            if layer.evicted:
                raise SavedCacheError(f"layer {index}: its press evicted {layer.evicted} tokens, which this format "
                                      "cannot save (allowed: tiers without a press)")
            tensors, counts = layer.export_state()
            kind = "codec"
        elif group == "native":
            tensors, counts, kind = {"keys": layer.keys, "values": layer.values}, {"length": layer.get_seq_length()}, \
                "native"
        else:
            if layer.record_past:
                raise SavedCacheError(f"sliding layer {index} records its past (assisted decoding): crop it first")
            tensors = {"keys": layer.keys, "values": layer.values}
            counts = {"cumulative_length": layer.cumulative_length}
            kind = "sliding"
        held = counts.get("length", counts.get("cumulative_length"))
        if held != ids.shape[1]:
            raise SavedCacheError(f"layer {index} holds {held} tokens but {ids.shape[1]} token ids were given "
                                  "(allowed: the ids of exactly the tokens the cache holds)")
        layers.append({"kind": kind, **counts})
        for key, tensor in tensors.items():
            grouped[group].setdefault(key, []).append(tensor.detach().cpu())
        variable.update(f"{group}.{key}" for key in getattr(layer, "variable_length", ()))
    tensors, splits = {"token_ids": ids.to(torch.int32).cpu().contiguous()}, {}
    for group, named in grouped.items():
        for key, parts in named.items():
            if len(parts) != groups.count(group):
                raise SavedCacheError(f"'{key}' is held by some {group} layers only: the layers disagree")
            if f"{group}.{key}" not in variable and all(p.shape == parts[0].shape for p in parts):
                tensors[f"{group}.{key}"] = torch.stack(parts).contiguous()
            elif all(p.dim() == 1 for p in parts):
                tensors[f"{group}.{key}"] = torch.cat(parts).contiguous()
                splits[f"{group}.{key}"] = [p.numel() for p in parts]
            else:
                raise SavedCacheError(f"'{key}' has different shapes across {group} layers: the layers disagree")
    pca = [layer.coder for layer in cache.layers if isinstance(layer, PCALayer)]
    header = {
        "format": FORMAT, "version": VERSION, "tier": tier_spec(cache.tier),
        "materialization_free": _mode(cache),
        "short_view": any(getattr(layer, "short_view", False) for layer in cache.layers),
        "model": {"name": name, "geometry": geometry, "calibration": calibration_digest(pca) if pca else None},
        "tokens": ids.shape[1], "batch": ids.shape[0], "layers": layers, "splits": splits, "extra": extra,
    }
    header["sha256"] = tensors_digest(tensors, json.loads(json.dumps(header)))  # as a reader will parse it
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    safetensors.torch.save_file(tensors, str(tmp), metadata={"codeckv": json.dumps(header, separators=(",", ":"))})
    os.replace(tmp, path)  # atomic: a reader never sees half a file
    return path.stat().st_size
