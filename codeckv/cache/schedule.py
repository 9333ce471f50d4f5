"""Per-layer schedules: a tier whose full-attention layers do not all use the same codec.

    tier = schedule("turbo-4", {0: "int8", 1: "int8", 29: "turbo-3"})   # a Tier named "turbo-4 · 0-1:int8, 29:turbo-3"
    tier.tier_at(0), tier.tier_at(5)                                      # int8, turbo-4 (plain tiers)
    cache = make_cache(loaded, "turbo-4", per_layer={0: "int8"})          # the same, through codeckv.cache
    tier = schedule("turbo-4", parse_layers("0-3:int8, 29:turbo-3"))      # the text the app's Advanced panel takes

A schedule is data like any tier (codeckv/tiers.py): `Tier.per_layer` holds (layer index, tier) pairs,
and every other layer uses the tier itself. Which layers a tier codes (`codes_layer`): every full-attention layer,
and every sliding-window (or chunked) layer and hybrid layer (keys and values beside a linear-attention state,
cache/hybrid_layer.py) unless the tier is a PCA tier, whose coders are calibrated on the
full-attention layers; the others (linear attention, a PCA tier's windows and hybrid layers) keep their native
cache. The cache
checks a schedule against the model (check_layers): an index past the model's layers, or a layer no tier codes
there, is refused with the allowed indices. "native" on a layer keeps that layer's
transformers cache (so `schedule("native", {3: "turbo-3"})` compresses layer 3 only: the sensitivity
probe of codeckv/measure/allocation.py). PCA tiers mix with the others: each PCA layer takes its coder
from its own tier's calibration; such a layer keeps a decoded view, so `materialization_free=True`
(attention on the codes everywhere) is refused for a schedule holding one.
"""

from __future__ import annotations

import dataclasses
import re

from codeckv.loaded import KV_KINDS
from codeckv.tiers import SKIP, TIERS, Tier, as_tier

MAX_SCHEDULE_CHARS = 600  # the Advanced panel's text: 30 layers of "12:jpeg-k8-int8, " fit
SEPARATOR = " · "  # between the base tier's name and the overrides in a schedule's name
_ENTRY = re.compile(r"^\s*(\d{1,4})\s*(?:-\s*(\d{1,4})\s*)?:\s*([A-Za-z0-9._-]+)\s*$")


def schedule(base: Tier | str, per_layer: dict[int, Tier | str]) -> Tier:
    """`base` on every layer but those `per_layer` maps (layer index -> tier or preset name); {} gives base itself."""
    base = base if isinstance(base, Tier) else as_tier(base)
    if base.per_layer:
        raise ValueError(f"tier '{base.name}' already has a per-layer schedule (allowed: a plain tier as the base)")
    if not isinstance(per_layer, dict):
        raise ValueError(f"per_layer={per_layer!r} must be a dict of layer index -> tier name (allowed tiers: "
                         f"{', '.join(TIERS)})")
    entries = []
    for index, tier in sorted(per_layer.items(), key=lambda item: _index(item[0])):
        tier = tier if isinstance(tier, Tier) else as_tier(tier)
        if tier != base:
            entries.append((index, tier))
    if not entries:
        return base
    overrides = layers_text({index: tier.name for index, tier in entries})
    return dataclasses.replace(
        base,
        name=f"{base.name}{SEPARATOR}{overrides}",
        description=f"{base.description}; per layer: {overrides}",
        per_layer=tuple(entries),
    )


def _index(value) -> int:
    """A layer index: a whole number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"layer index {value!r} must be a whole number >= 0")
    return value


def codes_layer(kind: str, tier: Tier) -> bool:
    """True when a plain `tier` codes a layer of type `kind` (module docstring); False: the layer stays native."""
    return kind == "full_attention" if tier.joint is not None else kind in KV_KINDS


def check_layers(tier: Tier, layer_types: list[str]) -> None:
    """Refuse a schedule naming a layer the model lacks, or one that its tier cannot code (module docstring)."""
    kv = [index for index, kind in enumerate(layer_types) if kind in KV_KINDS]
    full = [index for index, kind in enumerate(layer_types) if kind == "full_attention"]
    for index, layer_tier in tier.per_layer:
        if index >= len(layer_types):
            raise ValueError(f"layer {index} does not exist: the model has {len(layer_types)} layers "
                             f"(allowed: the attention layers {ranges(kv)})")
        if layer_types[index] not in KV_KINDS:
            raise ValueError(f"layer {index} is a {layer_types[index]} layer, which keeps its native cache; "
                             f"'{layer_tier.name}' cannot go there (allowed: the attention layers {ranges(kv)})")
        if not layer_tier.is_native and not codes_layer(layer_types[index], layer_tier):
            raise ValueError(f"layer {index} is a {layer_types[index]} layer, which PCA tiers leave native "
                             f"(calibrated on full attention only); '{layer_tier.name}' cannot go there (allowed: the "
                             f"full-attention layers {ranges(full)}, or a per-tensor tier)")


def boundary_layers(tier: Tier, layer_types: list[str]) -> list[int]:
    """The layers a tier's `boundary` leaves native, as vLLM's get_boundary_skip_layers picks them: the first and last
    min(boundary, layers // 2) layers of a model whose layers all keep keys and values; none on a hybrid (a model
    with linear-attention or other stateful layers), where vLLM protects none."""
    count = len(layer_types)
    if not tier.boundary or any(kind not in KV_KINDS for kind in layer_types):
        return []
    n = min(tier.boundary, count // 2)
    return sorted({*range(n), *range(count - n, count)})


def bound_to_layers(tier: Tier, layer_types: list[str]) -> Tier:
    """A tier with boundary layers as the per-layer schedule it is on this model: those layers native, the name kept."""
    if not tier.boundary:
        return tier
    kept = boundary_layers(tier, layer_types)
    if len(kept) == len(layer_types):
        named = SKIP.match(tier.name)
        raise ValueError(f"tier '{tier.name}' keeps its first and last {tier.boundary} layers native (vLLM's rule), "
                         f"which are all {len(layer_types)} layers of this model: nothing would be coded (allowed: a "
                         f"model of more than {2 * tier.boundary} layers, or "
                         f"'{named['base'] if named else tier.name}-skip0', every layer coded)")
    native = TIERS["native"]
    return dataclasses.replace(tier, boundary=0, per_layer=tuple((index, native) for index in kept))


def tiers_used(tier: Tier) -> list[Tier]:
    """The distinct plain tiers of a schedule: its base first, then its overrides (a plain tier: itself)."""
    return list(dict.fromkeys([dataclasses.replace(tier, per_layer=()), *(t for _, t in tier.per_layer)]))


def layer_tiers(tier: Tier, layer_types: list[str]) -> list[Tier | None]:
    """The plain tier of every model layer (None where the layer stays native: codes_layer)."""
    tier = bound_to_layers(tier, layer_types)
    check_layers(tier, layer_types)
    return [tier.tier_at(index) if codes_layer(kind, tier.tier_at(index)) else None
            for index, kind in enumerate(layer_types)]


def ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs) or "none"


def layers_text(per_layer: dict[int, str]) -> str:
    """{0: 'int8', 1: 'int8', 29: 'turbo-3'} -> '0-1:int8, 29:turbo-3' (runs of neighbouring layers joined)."""
    runs: list[list] = []  # [first, last, name]
    for index in sorted(per_layer):
        name = per_layer[index]
        if runs and runs[-1][2] == name and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index, name])
    return ", ".join(f"{lo}:{name}" if lo == hi else f"{lo}-{hi}:{name}" for lo, hi, name in runs)


def parse_layers(text: str, max_chars: int = MAX_SCHEDULE_CHARS) -> dict[int, str]:
    """'0-3:int8, 29:turbo-3' -> {0: 'int8', ..., 3: 'int8', 29: 'turbo-3'}; '' -> {}. Preset tier names only.

    Entries are separated by commas; a layer named twice, a reversed range, an unknown tier or a text longer
    than max_chars is refused with a ValueError that says what is allowed.
    """
    if not isinstance(text, str):
        raise ValueError(f"the per-layer schedule must be text, got {type(text).__name__}")
    if len(text) > max_chars:
        raise ValueError(f"the per-layer schedule has {len(text):,} characters (allowed: at most {max_chars})")
    per_layer: dict[int, str] = {}
    for entry in filter(str.strip, text.split(",")):
        match = _ENTRY.match(entry)
        if match is None:
            raise ValueError(f"per-layer entry {entry.strip()!r} is not 'layer:tier' or 'first-last:tier' "
                             "(e.g. '0-3:int8, 29:turbo-3')")
        lo, hi, name = int(match[1]), int(match[2] or match[1]), match[3]
        if hi < lo:
            raise ValueError(f"per-layer entry {entry.strip()!r}: the range runs backwards (allowed: first <= last)")
        if name not in TIERS:
            raise ValueError(f"per-layer entry {entry.strip()!r}: unknown tier {name!r} (allowed: {', '.join(TIERS)})")
        for index in range(lo, hi + 1):
            if index in per_layer:
                raise ValueError(f"layer {index} is given a tier twice ({per_layer[index]} and {name})")
            per_layer[index] = name
    return per_layer
