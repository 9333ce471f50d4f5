"""Static FP8 scales calibrated the way llm-compressor calibrates them: per layer and KV head, the largest |key| and
|value| over a calibration text, over the format's largest value.

    scales = kv_scales(loaded)                    # KVScales: per layer, (keys' absmax, values' absmax) per head
    tier = scales.tier_at(tier, index)            # layer `index`'s tier, its FP8 codecs' scales set
    scales = KVScales("tiny", kv_absmax(model, ids))  # the computation alone, on any (N, S) token ids

A tier asks for them with FP8(scale="calibrated") (codecs/fp8.py); make_cache(loaded, ...) reads them
(cache/calibration.py, calibration_for) and gives every layer its own. The text is the PCA calibration's
(cache/calibration_text.py: never a quality window), WINDOWS x LENGTH tokens, one native forward each; the absmax (a
"minmax" observer) over it is llm-compressor's static scale for kv_cache_scheme with its per-head strategy. Computed
once per model (seconds), then read from $CODECKV_CACHE/calibration.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from codeckv.cache.calibration_text import calibration_dir, calibration_windows
from codeckv.codecs.fp8 import CALIBRATED, FP8
from codeckv.tiers import Tier

WINDOWS, LENGTH = 8, 512  # calibration text: 4k tokens
VERSION = 1  # bump when the recipe changes: old files are then ignored
SMALLEST = 1e-12  # a head whose values were all 0 still gets a positive scale


@dataclass
class KVScales:
    """A model's absmax of keys and values per layer and KV head over the calibration text."""

    model: str
    layers: dict[int, tuple[torch.Tensor, torch.Tensor]]  # layer -> ((H,) keys' absmax, (H,) values') float32

    def tier_at(self, tier: Tier, index: int) -> Tier:
        """The plain `tier` on layer `index`: each FP8(scale="calibrated") codec given one scale per head."""
        if index not in self.layers:
            raise ValueError(f"the FP8 scales of '{self.model}' have no layer {index} (allowed: the model they were "
                             "calibrated on)")
        keys, values = self.layers[index]

        def scaled(codec, absmax: torch.Tensor):
            if not (isinstance(codec, FP8) and codec.scale == CALIBRATED):
                return codec
            scale = (absmax.clamp_min(SMALLEST) / codec.largest).tolist()
            return dataclasses.replace(codec, scale=tuple(float(s) for s in scale))

        return dataclasses.replace(tier, key=scaled(tier.key, keys), value=scaled(tier.value, values))


def needs_scales(tier: Tier) -> bool:
    """True when a codec of `tier` (or of its schedule) asks for calibrated scales."""
    tiers = [tier, *(t for _, t in tier.per_layer)]
    return any(isinstance(codec, FP8) and codec.scale == CALIBRATED for t in tiers for codec in (t.key, t.value))


def kv_scales(loaded) -> KVScales:
    """A LoadedModel's KVScales (module docstring): read from disk, else computed (a native forward per window)."""
    name = loaded.info.name
    path = calibration_dir() / f"{_safe(name)}-kvscales-{_digest(name)}.pt"
    if path.exists():
        state = torch.load(path, weights_only=True)
        if state.get("version") == VERSION:
            return KVScales(name, {int(i): (s["keys"], s["values"]) for i, s in state["layers"].items()})
    found = kv_absmax(loaded.model, calibration_windows(loaded.tokenizer, WINDOWS, LENGTH))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # two processes computing at once never share one
    torch.save({"version": VERSION, "layers": {i: {"keys": k, "values": v} for i, (k, v) in found.items()}}, tmp)
    tmp.replace(path)  # atomic: a reader never sees half a file
    return KVScales(name, found)


@torch.inference_mode()
def kv_absmax(model, ids: torch.Tensor) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Per layer holding keys and values, their absmax per KV head over the (N, S) windows, one native forward each
    (a sliding-window layer: over the tokens its window holds at the end of each)."""
    found: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for window in ids:
        cache = DynamicCache(config=model.config)
        model(window[None].to(model.device), cache=cache, use_cache=True)
        for index, layer in enumerate(cache.layers):
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            if keys is None or not keys.numel():
                continue
            seen = (keys.abs().float().amax((0, 2, 3)).cpu(), values.abs().float().amax((0, 2, 3)).cpu())
            old = found.get(index)
            found[index] = seen if old is None else (torch.maximum(old[0], seen[0]), torch.maximum(old[1], seen[1]))
    return found


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "_" for c in name)


def _digest(model: str) -> str:
    key = {"model": model, "windows": WINDOWS, "length": LENGTH, "version": VERSION}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
