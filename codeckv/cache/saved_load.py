"""Load a .kvc file (cache/saved_format.py) back into a CodecCache, checking everything before reading a tensor.

    saved = load_cache("chat.kvc", loaded)          # SavedCache: .cache (a CodecCache at rest), .token_ids, .header
    loaded.model(next_ids, cache=saved.cache)       # goes on exactly as the cache that was saved would have

Checked, in order: the file size (max_bytes), the safetensors header (every offset inside the file, nothing
missing at its end), the JSON, format and version, the tier (rebuilt from data, never imported by name), the
model (geometry and name), the calibration of a PCA tier, every count, and every tensor's name, dtype and shape
against what the layers of this tier expect; then the sha256 of what it read. Any failure raises
SavedCacheError (a ValueError) with the reason and what is allowed; nothing is loaded.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import safetensors
import torch

from codeckv.cache.calibration import calibration_for
from codeckv.cache.codec_cache import CodecCache
from codeckv.cache.coded_layer import CodedLayer
from codeckv.cache.kv_scales import needs_scales
from codeckv.cache.layers import CodecLayer
from codeckv.cache.pca_layer import PCALayer
from codeckv.cache.saved_format import (
    DTYPES,
    FORMAT,
    MAX_FILE_BYTES,
    MAX_HEADER_BYTES,
    READABLE_VERSIONS,
    SavedCache,
    SavedCacheError,
    calibration_digest,
    model_and_name,
    model_geometry,
    tensor_groups,
    tensors_digest,
    tier_from_spec,
)
from codeckv.cache.schedule import tiers_used
from codeckv.codecs.pca import sink_codec
from codeckv.codecs.rate import SKIP
from codeckv.loaded import LoadedModel


def read_header(path: str | Path, max_bytes: int = MAX_FILE_BYTES) -> tuple[dict, dict]:
    """(the codeckv header, {tensor name: (dtype, shape)}) of a file, checked, without reading any tensor."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as err:
        raise SavedCacheError(f"{path.name}: cannot be read ({err.strerror})") from None
    if size > max_bytes:
        raise SavedCacheError(f"{path.name} is {size:,} bytes, more than the {max_bytes:,} allowed here")
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise SavedCacheError(f"{path.name} is truncated or not a cache file ({size} bytes)")
        (length,) = struct.unpack("<Q", prefix)
        if length > min(size - 8, MAX_HEADER_BYTES):
            raise SavedCacheError(f"{path.name}: its header claims {length:,} bytes (allowed: at most "
                                  f"{min(size - 8, MAX_HEADER_BYTES):,}): truncated, or not a cache file")
        raw = f.read(length)
    try:
        entries = json.loads(raw)
        header = json.loads(entries.pop("__metadata__")["codeckv"])
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise SavedCacheError(f"{path.name} is not a {FORMAT} file (its header is not the JSON this format "
                              "writes)") from None
    shapes, end = {}, 0
    for name, entry in entries.items():
        try:
            dtype, shape = DTYPES[entry["dtype"]], [int(n) for n in entry["shape"]]
            lo, hi = (int(n) for n in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise SavedCacheError(f"{path.name}: tensor '{name}' is described wrongly (allowed dtypes: "
                                  f"{', '.join(DTYPES)})") from None
        if min(shape, default=0) < 0 or hi - lo != math.prod(shape) * dtype.itemsize or lo < 0:
            raise SavedCacheError(f"{path.name}: tensor '{name}' has offsets that do not match its shape")
        shapes[name], end = (dtype, tuple(shape)), max(end, hi)
    if 8 + length + end != size:
        raise SavedCacheError(f"{path.name} is {size:,} bytes but its header describes {8 + length + end:,}: "
                              "the file is truncated or has extra bytes")
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise SavedCacheError(f"{path.name} is not a {FORMAT} file (format {header.get('format')!r})")
    if header.get("version") not in READABLE_VERSIONS:
        raise SavedCacheError(f"{path.name} is {FORMAT} version {header.get('version')!r}, which this codeckv "
                              f"cannot read (allowed: {', '.join(map(str, READABLE_VERSIONS))})")
    return header, shapes


def load_cache(path: str | Path, source, max_bytes: int = MAX_FILE_BYTES, materialization_free: bool | None = None,
               calibration=None) -> SavedCache:
    """Rebuild the CodecCache saved at `path` for `source` (a LoadedModel or a transformers model), at rest.

    max_bytes: the largest file accepted (checked from its size first). materialization_free: None = as saved.
    calibration: a PCA tier's Calibration when `source` is a bare model (a LoadedModel finds its own).
    Raises SavedCacheError (checks in the module docstring); nothing is allocated before they pass.
    """
    header, shapes = read_header(path, max_bytes)
    model, name = model_and_name(source)
    if model is None:
        raise SavedCacheError("load_cache needs the model the cache is for (allowed: a LoadedModel or a model)")
    try:
        tokens, batch, layers, splits = (header[k] for k in ("tokens", "batch", "layers", "splits"))
        saved_model, mode = header["model"], header["materialization_free"]
        saved_name, geometry = saved_model["name"], saved_model["geometry"]
    except (KeyError, TypeError):
        raise SavedCacheError("the header lacks fields of this format (tokens, batch, layers, splits, model, "
                              "materialization_free)") from None
    if not (_count(tokens, 1) and _count(batch, 1) and isinstance(layers, list) and isinstance(splits, dict)):
        raise SavedCacheError("the header's tokens, batch, layers or splits are not what this format writes")
    if shapes.get("token_ids") != (torch.int32, (batch, tokens)):
        raise SavedCacheError(f"the file's token ids are not the {batch} x {tokens} the header says (corrupted file)")
    context = getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)
    if context is not None and tokens > context:
        raise SavedCacheError(f"the file holds {tokens:,} tokens, more than this model's context of {context:,}")
    tier = tier_from_spec(header.get("tier"))
    if tier.is_native:
        raise SavedCacheError("the header's tier is native (allowed: a tier that encodes)")
    if saved_name and name and saved_name != name:
        raise SavedCacheError(f"this cache was saved from {saved_name}, not {name} (allowed: the same model)")
    if materialization_free is not None:
        mode = bool(materialization_free)
    elif mode is not None:
        mode = bool(mode)
    if (any(t.joint is not None for t in tiers_used(tier)) or needs_scales(tier)) and calibration is None:
        if not isinstance(source, LoadedModel):
            raise SavedCacheError(f"tier '{tier.name}' needs the model's calibration: pass a LoadedModel or "
                                  "calibration=")
        calibration = calibration_for(source, tier)
    try:
        cache = CodecCache.from_config(model.config, tier, mode, calibration)
    except ValueError as err:
        raise SavedCacheError(f"the saved tier cannot run on this model: {err}") from None
    if materialization_free is None and header.get("short_view") is True:  # as saved: the default path's choice
        for layer in cache.layers:
            if isinstance(layer, CodedLayer):
                layer.short_view = True
    if geometry != model_geometry(model, cache):
        raise SavedCacheError(f"this cache was saved from a model of another shape ({geometry}) than "
                              f"{name or 'this model'} ({model_geometry(model, cache)}) (allowed: the same model)")
    pca = [layer.coder for layer in cache.layers if isinstance(layer, PCALayer)]
    if pca and saved_model.get("calibration") != calibration_digest(pca):
        raise SavedCacheError(f"tier '{tier.name}' was calibrated differently where this cache was saved "
                              "(allowed: a file saved with the same calibration of the same model)")
    groups = tensor_groups(cache)
    counts = _checked_counts(cache, layers, tokens, groups)
    expected = _expected(cache, counts, groups, batch, tokens, geometry, model.dtype)
    _check_tensors(expected, shapes, splits)
    tensors = _read(path, sorted(expected))
    if header["version"] < 3 and header.get("extra") is not None:
        raise SavedCacheError(f"{Path(path).name} is version {header['version']}, whose checksum leaves out the "
                              "application data it carries, so a change to it would go unseen (allowed: files of "
                              "version 3, or without application data)")
    if tensors_digest(tensors, header if header["version"] >= 3 else None) != header.get("sha256"):
        raise SavedCacheError("the file's header or tensors do not match its checksum: the file is corrupted")
    ids = tensors["token_ids"].long()
    vocab = model.config.get_text_config(decoder=True).vocab_size
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise SavedCacheError(f"the saved token ids are outside this model's vocabulary (allowed: 0..{vocab - 1})")
    _fill(cache, counts, groups, tensors, splits, model.device)
    return SavedCache(cache, ids, header)


def _count(value, least: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _checked_counts(cache, layers: list, tokens: int, groups: list[str]) -> list[dict]:
    """The header's per-layer counts, checked against the tier's archiving rules (what a real cache can hold)."""
    if len(layers) != len(cache.layers):
        raise SavedCacheError(f"the header describes {len(layers)} layers, the model has {len(cache.layers)}")
    checked = []
    for index, (counts, layer, group) in enumerate(zip(layers, cache.layers, groups)):
        if not isinstance(counts, dict):
            raise SavedCacheError(f"layer {index}: its entry is not an object")
        if isinstance(layer, CodecLayer):
            length, upto = counts.get("length"), counts.get("archived_upto")
            raw_until = counts.get("raw_until", 0)  # absent: a file from before raw_until, archived from the start
            first = counts.get("first", 0) if layer.window is not None else 0
            start = max(layer.tier.keep_first, first) if _count(first) else -1  # where the archive begins
            keep_recent = layer.tier.keep_recent
            valid = (counts.get("kind") == "codec" and _count(length) and _count(upto) and length == tokens
                     and (raw_until is None or _count(raw_until)) and _count(first) and start >= 0
                     and start <= upto <= max(length, start) and (upto - start) % layer.unit == 0)
            if valid and layer.window is not None:  # a window holds at least what transformers' would, some units more
                valid = min(length, layer.window - 1) <= length - first < layer.window + 2 * layer.unit + keep_recent
            held_raw = valid and upto == start and (raw_until is None or length - first < raw_until)
            valid = valid and (held_raw or length - keep_recent - upto < layer.unit)
            entry = {"kind": "codec", "length": length, "archived_upto": upto, "raw_until": raw_until}
            entry |= {"first": first} if layer.window is not None else {}
        elif group == "native":
            valid = counts.get("kind") == "native" and counts.get("length") == tokens
            entry = {"kind": "native", "length": tokens}
        else:
            cumulative = counts.get("cumulative_length")
            valid = counts.get("kind") == "sliding" and cumulative == tokens
            entry = {"kind": "sliding", "cumulative_length": cumulative}
        if not valid:
            raise SavedCacheError(f"layer {index}: counts {counts} are not what a {tokens}-token cache of this tier "
                                  "holds (the file is corrupted)")
        checked.append(entry)
    for group in set(groups) - {"sliding", "native"}:
        if len({json.dumps(c, sort_keys=True) for c, g in zip(checked, groups) if g == group}) > 1:
            raise SavedCacheError("the counts of codec layers of one tier disagree (the file is corrupted)")
    return checked


def _expected(cache, counts: list[dict], groups: list[str], batch: int, tokens: int, geometry: dict, dtype) -> dict:
    """{tensor name: (dtype, shape)} the file must hold, from the tiers, the counts and the model's geometry."""
    b, h, d = batch, geometry["kv_heads"], geometry["head_dim"]
    expected = {"token_ids": (torch.int32, (b, tokens))}
    sliding = [layer for layer, c in zip(cache.layers, counts) if c["kind"] == "sliding"]
    native = sum(c["kind"] == "native" for c in counts)
    for name in ("keys", "values") if native else ():
        expected[f"native.{name}"] = (dtype, (native, b, h, tokens, d))
    for group in dict.fromkeys(g for g in groups if g not in ("sliding", "native")):
        members = [(layer, c) for layer, c, g in zip(cache.layers, counts, groups) if g == group]
        for name, (kind_dtype, shape) in _expected_per_layer(*members[0], b, h, d, dtype).items():
            expected[f"{group}.{name}"] = (kind_dtype, len(members) if shape is None else (len(members), *shape))
    if sliding:
        window = min(tokens, sliding[0].sliding_window - 1)
        for name in ("keys", "values"):
            expected[f"sliding.{name}"] = (dtype, (len(sliding), b, h, window, d))
        if any(layer.sliding_window != sliding[0].sliding_window for layer in sliding):
            raise SavedCacheError("this model's sliding layers have different windows, which this format cannot load")
    return expected


def _expected_per_layer(layer, c: dict, b: int, h: int, d: int, dtype) -> dict:
    """{tensor name: (dtype, shape)} one codec layer of this tier exports holding the tokens its counts `c` say."""
    length, upto, keep_first = c["length"], c["archived_upto"], layer.tier.keep_first
    start = max(keep_first, c.get("first", 0))
    sinks, tail = (dtype, (b, h, min(length, keep_first), d)), (dtype, (b, h, length - min(upto, length), d))
    per_layer = {"sink_keys": sinks, "sink_values": sinks, "tail_keys": tail, "tail_values": tail}
    archived = upto - start
    if archived > 0 and isinstance(layer, PCALayer):
        chunks = archived // layer.unit
        per_layer["stream_lengths"] = (torch.int32, (chunks,))
        per_layer["rungs"] = (torch.uint8, (chunks,))
        per_layer["streams"] = (torch.uint8, None)  # variable length: one length per layer in splits
        for j in range(chunks):
            rows = min(max(layer.coder.sink_tokens - keep_first - j * layer.unit, 0), layer.unit)
            if rows:
                for side in ("keys", "values"):
                    for name, t in sink_codec(d).encode(torch.zeros(b, h, rows, d, dtype=dtype)).data.items():
                        per_layer[f"sink{j}.{side}.{name}"] = (t.dtype, tuple(t.shape))
    elif archived > 0:
        fitted = layer.tier.for_head_dims(d, d)  # as the layer fits it to the states it holds (codecs/fit.py)
        for side, codec_of in (("keys", fitted.key), ("values", fitted.value)):
            probe = codec_of.encode(torch.zeros(b, h, layer.unit, d, dtype=dtype))
            for name, t in probe.data.items():
                shape = (*t.shape[:2], t.shape[2] * archived // layer.unit, *t.shape[3:])
                per_layer[f"{side}.{name}"] = (t.dtype, shape)
    return per_layer


def _check_tensors(expected: dict, shapes: dict, splits: dict) -> None:
    """Every expected tensor present with its dtype and shape, nothing else.

    expected: name -> (dtype, shape), or (dtype, layers) for a 1-D tensor concatenated over that many layers,
    whose lengths per layer the header's splits give.
    """
    missing, unexpected = sorted(set(expected) - set(shapes)), sorted(set(shapes) - set(expected))
    if missing or unexpected:
        raise SavedCacheError(f"the file's tensors are not this tier's: missing {missing}, unexpected {unexpected}")
    variable = {name for name, (_, shape) in expected.items() if isinstance(shape, int)}
    if set(splits) != variable:
        raise SavedCacheError(f"the header's splits name {sorted(splits)}, this tier's variable-length tensors are "
                              f"{sorted(variable)} (the file is corrupted)")
    for name, (dtype, shape) in expected.items():
        got_dtype, got_shape = shapes[name]
        if name in variable:
            parts = splits[name]
            if not (isinstance(parts, list) and len(parts) == shape and all(_count(p) for p in parts)):
                raise SavedCacheError(f"the header's splits of '{name}' are not {shape} lengths (corrupted file)")
            shape = (sum(parts),)
        if got_dtype != dtype or got_shape != shape:
            raise SavedCacheError(f"tensor '{name}' is {got_dtype} {list(got_shape)}, this tier holds {dtype} "
                                  f"{list(shape)} here (the file is corrupted)")


def _read(path: Path, names: list[str]) -> dict[str, torch.Tensor]:
    try:
        with safetensors.safe_open(str(path), framework="pt", device="cpu") as f:
            return {name: f.get_tensor(name) for name in names}
    except (OSError, safetensors.SafetensorError) as err:
        raise SavedCacheError(f"{Path(path).name}: its tensors cannot be read ({err})") from None


def _fill(cache, counts: list[dict], groups: list[str], tensors: dict, splits: dict, device) -> None:
    """Hand every layer its tensors (unstacked from its group), on the model's device."""
    positions = dict.fromkeys(groups, 0)
    for layer, c, group in zip(cache.layers, counts, groups):
        position = positions[group]
        positions[group] += 1
        mine = {}
        for name, t in tensors.items():
            if name.startswith(f"{group}."):
                key = name.split(".", 1)[1]
                if name in splits:
                    lo = sum(splits[name][:position])
                    mine[key] = t[lo : lo + splits[name][position]].to(device)
                else:
                    mine[key] = t[position].to(device)
        if c["kind"] == "codec":
            lengths = mine.get("stream_lengths")
            if lengths is not None and (int(lengths.min()) < 0 or int(lengths.long().sum()) != mine["streams"].numel()):
                raise SavedCacheError("a layer's stream lengths disagree with its streams (the file is corrupted)")
            rungs = mine.get("rungs")
            if rungs is not None and (int(rungs.max()) > SKIP or bool(((rungs == SKIP) & (lengths != 0)).any())):
                raise SavedCacheError(f"a layer's chunk rungs are not 0..{SKIP} with no stream at {SKIP} "
                                      "(the file is corrupted)")
            layer.load_state(mine, c)
        else:
            layer.lazy_initialization(mine["keys"], mine["values"])
            layer.keys, layer.values = mine["keys"], mine["values"]
            if c["kind"] == "sliding":
                layer.cumulative_length = c["cumulative_length"]
