"""CodecCache: a real `transformers` Cache whose attention layers store KV through a codec tier.

    cache = make_cache(model.config, "turbo-4")                  # DynamicCache for "native"
    model.generate(input_ids, cache=cache, max_new_tokens=64)
    cache.footprint()                                            # archive / resident / bf16-reference bytes
    cache = make_cache(loaded, "pca-8x")                         # a LoadedModel: PCA tiers get their calibration
    cache = make_cache(config, "turbo-4", raw_until=None)        # raw until the tier's own N, as the Chat builds it

One codec layer per full-attention layer (cache/layers.py, coded_layer.py, pca_layer.py) and per sliding-window
layer (which drops its tokens as the window moves), except for a PCA tier, calibrated on full attention; other
layers (linear attention, a PCA tier's windows) keep their native transformers layer (cache/schedule.py,
codes_layer). A model whose attention cannot read stored codes (codes_reason: not routed through
codeckv's attention, MLA's latent) gets a decoded view. `materialization_free` picks where
attention reads the archive (None: the stored codes wherever a kernel reads them, else a decoded view);
`attention` reports it per layer. docs/architecture.md has the table of modes. Each layer holds its first
tokens raw, as a native layer, until archiving pays off when asked (`raw_until=None`: the tier's own N, what the
app's Chat does; the default 0 archives from the first unit; docs/architecture.md, "Raw until N"); `raw_until`
reports it per layer.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time

import torch
from transformers.cache_utils import (
    DYNAMIC_LAYER_TYPE_MAPPING,
    Cache,
    DynamicCache,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    get_layer_types_and_kwargs,
)

from codeckv.cache.calibration import Calibration, Deferred, budget_shares, calibration_for
from codeckv.cache.coded_layer import CodedLayer
from codeckv.cache.flush import flush_layers
from codeckv.cache.footprint import Footprint, LayerFootprint
from codeckv.cache.hybrid_layer import HYBRID, HybridCodecLayer, HybridCodedLayer
from codeckv.cache.kv_scales import KVScales, needs_scales
from codeckv.cache.layers import CodecLayer
from codeckv.cache.pca_layer import PCALayer
from codeckv.cache.reasons import codes_reason, view_reason
from codeckv.cache.saved_format import save_cache
from codeckv.cache.schedule import bound_to_layers, layer_tiers, schedule
from codeckv.loaded import WINDOWED, LoadedModel
from codeckv.presses import Budget, Decoding, check_press_mode
from codeckv.tiers import Tier, as_tier

# Where a codec layer's attention reads its archived tokens (CodecCache.attention; serve/formatting.py phrases them):
# on the stored codes, on a decoded view while the context is short (SHORT_VIEW_TOKENS), or on a decoded view.
CODES, SHORT_VIEW, VIEW = "codes", "short view", "view"


class CodecCache(Cache):
    """A transformers Cache with codec layers on full-attention layers and native layers elsewhere."""

    def __init__(self, layers: list, tier: Tier) -> None:
        super().__init__(layers=layers)
        self.tier = tier

    @property
    def attention(self) -> dict[int, str]:
        """Per codec layer (its model layer index), where attention reads its archived tokens now: CODES, SHORT_VIEW
        (a codes layer whose decode steps read a short context's view, cache/coded_layer.py) or VIEW."""
        return {index: (CODES if not layer.on_view else SHORT_VIEW) if isinstance(layer, CodedLayer) else VIEW
                for index, layer in enumerate(self.layers) if isinstance(layer, CodecLayer)}

    @property
    def raw_until(self) -> dict[int, int | None]:
        """Per codec layer that has seen a token (its model layer index), the tokens it holds raw before it archives
        (cache/layers.py, "Raw until N"): 0 = from the first complete unit, None = never (png)."""
        return {index: layer.raw_until for index, layer in enumerate(self.layers)
                if isinstance(layer, CodecLayer) and layer.is_initialized}

    @property
    def press_mode(self) -> str:
        """When this cache's press evicts: "once" or "chunked" (codeckv/presses/base.py PRESS_MODES)."""
        return next((layer.press_mode for layer in self.layers if isinstance(layer, CodecLayer)), "once")

    def set_press_mode(self, mode: str) -> None:
        """Press the context once (kvpress's protocol) or every prefill chunk as it arrives, on every codec layer."""
        check_press_mode(mode)
        for layer in self.layers:
            if isinstance(layer, CodecLayer):
                layer.set_press_mode(mode)

    def set_raw_until(self, tokens: int | None) -> None:
        """Hold tokens raw until `tokens` on every codec layer of this fresh cache (0: archive from the first unit,
        as the quality measurements do; None: each tier's own N)."""
        layers = [layer for layer in self.layers if isinstance(layer, CodecLayer)]
        if any(layer.is_initialized for layer in layers):
            raise ValueError("set_raw_until(): the cache has held tokens (allowed: a fresh or reset cache)")
        for layer in layers:
            layer.ask_raw_until(tokens)

    @classmethod
    def from_config(
        cls, config, tier: Tier | str, materialization_free: bool | None = None,
        calibration: Calibration | None = None, raw_until: int | None = 0, **overrides,
    ) -> CodecCache:
        """Build the cache for a model config; `overrides` replace tier fields (e.g. keep_recent=32).

        materialization_free: True = CodedLayer (attention on the stored codes, no decoded view), False =
        CodecLayer (a decoded view), None = the codes wherever the tier allows (view_reason) and the model
        attends through codeckv.cache.attention (load_model does that; else use_codec_attention(model)), else the view;
        with None, decode steps up to SHORT_VIEW_TOKENS read a decoded view (SHORT_VIEW, codeckv/cache/coded_layer.py).
        calibration: the model's Calibration for a PCA tier (codeckv.cache.calibration.calibration_for), required there
        (a list of them for a per-layer schedule mixing PCA tiers: codeckv/cache/schedule.py), or a Deferred one
        resolved at the first archive (calibration.ready_or_deferred: with raw_until=None, a short chat needs none).
        raw_until: tokens each codec layer holds raw before it archives; 0 (default) = archive from the first
        complete unit, None = the tier's own N (cache/layers.py).
        """
        tier = _tier(tier, overrides)
        why_not = codes_reason(config)
        if why_not is not None and any(t.press is not None for t in (tier, *(t for _, t in tier.per_layer))):
            raise ValueError(f"tier '{tier.name}' evicts tokens after each prefill chunk's attention, which its press "
                             f"scores in codeckv's attention function; here {why_not} (allowed: a tier without a "
                             "press)")
        if why_not is not None and materialization_free:
            raise ValueError(f"materialization_free=True: attention cannot read this model's stored codes: {why_not} "
                             "(allowed: None, which keeps a decoded view here, or False)")
        if why_not is not None:
            materialization_free = False
        layer_types, layer_kwargs = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
        tier = bound_to_layers(tier, layer_types)
        new_layer = _codec_layer(tier, materialization_free, calibration, layer_types, raw_until, layer_kwargs)
        coded = [t is not None and not t.is_native for t in layer_tiers(tier, layer_types)]
        layers = [new_layer(index) if coded[index] else DYNAMIC_LAYER_TYPE_MAPPING[kind](**kwargs)
                  for index, (kind, kwargs) in enumerate(zip(layer_types, layer_kwargs))]
        return cls(layers, tier)

    @classmethod
    def from_cache(
        cls, cache: Cache, tier: Tier | str, materialization_free: bool | None = None,
        calibration: Calibration | None = None, raw_until: int | None = 0,
        queries: dict[int, torch.Tensor] | None = None, rope: dict | None = None, **overrides,
    ) -> CodecCache:
        """Convert a native cache (e.g. a DynamicCache right after a prefill) into a codec cache, in one go.

        Every full-attention layer (a plain DynamicLayer) becomes a codec layer holding the same tokens,
        archived in batched encodes per codec (flush_layers): the same archive bytes and the same
        decoded tokens as prefilling through the codec cache and flushing (below raw_until, as from_config's,
        the tokens stay raw). Other layers (sliding window, ...) are deep-copied, so `cache` is left as it was
        and stays usable. The fast path for a long prompt: prefill natively (SDPA on the raw tokens), convert once.

        A tier with a press needs the prefill's queries ({layer index: (B, Hq, S, D)}, codeckv.cache.attention's
        captured_queries) and, for a press that reads queries before RoPE, {layer index: rope_at} (cache/rope.py):
        each layer then presses the tokens it took as the context, once, exactly as prefilling the same tokens
        through the press's cache in one forward does (the press acts after the attention, which saw every token).
        """
        tier = _tier(tier, overrides)
        if tier.is_native:
            raise ValueError(f"tier '{tier.name}' is native: keep the cache itself (allowed: a tier that encodes)")
        if tier.evicts and not isinstance(tier.press, Decoding) and (queries is None or isinstance(tier.press, Budget)):
            raise ValueError(f"tier '{tier.name}' has a press, which scores the prefill with its queries: pass the "
                             "prefill's queries (codeckv.cache.attention.captured_queries) or prefill through "
                             "make_cache(...)'s cache (a token budget always does)")
        kinds = {DynamicLayer: "full_attention", DynamicSlidingWindowLayer: "sliding_attention"}
        layer_types = [kinds.get(type(layer), type(layer).__name__) for layer in cache.layers]
        layer_kwargs = [{"sliding_window": getattr(layer, "sliding_window", None)} for layer in cache.layers]
        tier = bound_to_layers(tier, layer_types)
        new_layer = _codec_layer(tier, materialization_free, calibration, layer_types, raw_until, layer_kwargs)
        coded = [t is not None and not t.is_native for t in layer_tiers(tier, layer_types)]
        layers = []
        for index, layer in enumerate(cache.layers):
            if not coded[index]:
                layers.append(copy.deepcopy(layer))
                continue
            converted = new_layer(index)
            if layer.is_initialized and layer.keys is not None and layer.keys.numel():
                held = layer.keys.shape[2]
                first = getattr(layer, "cumulative_length", held) - held  # the tokens a window dropped
                converted.adopt(layer.keys, layer.values, first)
                if tier.evicts and not first and not isinstance(tier.press, Decoding):  # it leaves the prefill alone
                    converted.press_context(queries[index], (rope or {}).get(index))
            layers.append(converted)
        result = cls(layers, tier)
        result.flush()
        return result

    def flush(self) -> None:
        """Archive now what the next update would archive (e.g. a prompt right after its prefill, to time it).

        Batched across layers (codeckv/cache/flush.py); sliding-window layers then drop what their window moved past.
        """
        layers = [layer for layer in self.layers if isinstance(layer, CodecLayer)]
        flush_layers(layers)
        for layer in layers:
            layer._slide()

    def compact(self) -> None:
        """Hold the cache at rest: each codec layer keeps its archive and raw tokens only, no decoded view.

        Native layers (sliding window) stay as they are. restore(), or the next forward, rebuilds the views.
        """
        self.flush()
        for layer in self.layers:
            if isinstance(layer, CodecLayer):
                layer.compact()

    def restore(self) -> float:
        """Rebuild the decoded views of a cache at rest, bit for bit: the seconds it took (0.0 if none was at rest)."""
        start = time.perf_counter()
        rebuilt = sum(layer.restore() for layer in self.layers if isinstance(layer, CodecLayer))
        return time.perf_counter() - start if rebuilt else 0.0

    def save(self, path, token_ids, model=None, extra=None) -> int:
        """Write the cache and the ids of the tokens it holds to `path` (cache/saved_format.py): the file's bytes.

        model: the LoadedModel (or transformers model) it belongs to, recorded and checked; extra: app JSON.
        Load it back with codeckv.load_cache(path, loaded).
        """
        return save_cache(self, path, token_ids, model, extra)

    def set_left_padding(self, attention_mask: torch.Tensor) -> None:
        """Tell the codec layers which leading positions of each row are padding ((B, T) mask, 0 = pad).

        Call it on an empty cache before a left-padded batch: the codecs then fit their scales to the
        real tokens only (CodecLayer._unpadded), so a padded row is coded like the same text alone.
        """
        pads = (attention_mask.cumsum(dim=-1) == 0).sum(dim=-1)
        for layer in self.layers:
            if isinstance(layer, CodecLayer):
                layer.set_left_padding(pads)

    def footprint(self) -> Footprint:
        """Archive, resident and bf16-reference bytes, per layer and in total."""
        return footprint(self)


def _tier(tier: Tier | str, overrides: dict) -> Tier:
    """`tier` (a name resolved here) with `overrides` replacing its fields."""
    tier = tier if isinstance(tier, Tier) else as_tier(tier)
    return dataclasses.replace(tier, **overrides) if overrides else tier


def _codec_layer(tier: Tier, materialization_free: bool | None, calibration, layer_types: list[str],
                 raw_until: int | None, layer_kwargs: list[dict]):
    """A function: layer index -> a new codec layer of that layer's tier, after checking that every one can be built.

    tier: a plain tier, or a per-layer schedule (checked against the model's layers: codeckv/cache/schedule.py);
    layer_kwargs: what transformers builds each layer with (a window's sliding_window, a hybrid's number_of_states).
    """
    plain = {t for t in layer_tiers(tier, layer_types) if t is not None and not t.is_native}
    if not plain and not tier.is_native:
        kinds = ", ".join(sorted(set(layer_types)))
        raise ValueError(f"tier '{tier.name}' codes none of this model's layers ({kinds}): PCA tiers code "
                         "full-attention layers only (allowed: a per-tensor tier, e.g. turbo-4, which codes "
                         "sliding-window layers too)")
    pca = [t for t in plain if t.joint is not None]
    given = calibration if isinstance(calibration, list | tuple) else [] if calibration is None else [calibration]
    scales = next((c for c in given if isinstance(c, KVScales)), None)
    if scales is None and any(needs_scales(t) for t in plain):
        raise ValueError(f"tier '{tier.name}' takes FP8 scales calibrated per layer and head: make_cache(loaded, "
                         f"'{tier.name}') with a LoadedModel, or calibration=codeckv.cache.kv_scales.kv_scales(loaded)")
    given = [c for c in given if not isinstance(c, KVScales)]
    if len(given) == 1 and isinstance(given[0], Calibration | Deferred) and len(pca) == 1:
        calibrations = {pca[0].joint: given[0]}  # one PCA tier: the calibration given is its own
    else:
        calibrations = _by_spec(given or None)
    served = layer_tiers(tier, layer_types)
    builders = {t: _plain_codec_layer(t, materialization_free, calibrations.get(t.joint), layer_types,
                                      [i for i, at in enumerate(served) if at == t], raw_until, layer_kwargs,
                                      scales if needs_scales(t) else None)
                for t in plain}
    return lambda index: builders[tier.tier_at(index)](index)


def _by_spec(calibration) -> dict:
    """{JointPCA spec: Calibration} of a Calibration, a list of them (one per PCA tier of a schedule), or None."""
    if calibration is None:
        return {}
    calibrations = calibration if isinstance(calibration, list | tuple) else [calibration]
    for c in calibrations:
        if not isinstance(c, Calibration):
            raise ValueError(f"calibration={c!r} is not a Calibration "
                             "(allowed: codeckv.cache.calibration.calibration_for)")
    return {c.spec: c for c in calibrations}


def _plain_codec_layer(tier: Tier, materialization_free: bool | None, calibration: Calibration | None,
                       layer_types: list[str], layers: list[int], raw_until: int | None, layer_kwargs: list[dict],
                       scales: KVScales | None = None):
    """A function: layer index -> a new codec layer of the plain `tier`, after checking that it can be built.

    layers: the model layers that get `tier` (a PCA tier shares its budget among them: budget_shares); scales: the
    model's FP8 scales, each layer's set in its codecs (cache/kv_scales.py), for a tier that takes them.
    """
    short_view = materialization_free is None  # the cache's own choice: a short context's decode steps on a view
    if materialization_free is None:
        materialization_free = view_reason(tier) is None
    if tier.joint is None:
        def per_tensor_layer(index: int) -> CodecLayer:
            kind, kwargs = layer_types[index], layer_kwargs[index]
            layer_tier = tier if scales is None else scales.tier_at(tier, index)
            window = kwargs.get("sliding_window") if kind in WINDOWED else None
            extra = {"number_of_states": kwargs.get("number_of_states", 1)} if kind in HYBRID else {}
            if materialization_free and tier.key is not None:  # a press alone keeps raw tokens: nothing coded
                cls = HybridCodedLayer if kind in HYBRID else CodedLayer
                return cls(layer_tier, short_view, raw_until, window, **extra)
            return (HybridCodecLayer if kind in HYBRID else CodecLayer)(layer_tier, raw_until, window, **extra)

        return per_tensor_layer
    if materialization_free:
        raise ValueError(f"tier '{tier.name}' codes keys and values jointly with entropy-coded chunks, which no "
                         "kernel reads: materialization_free=True is not supported (allowed: None or False, a view)")
    if calibration is None:
        raise ValueError(f"tier '{tier.name}' needs the model's calibration: make_cache(loaded, '{tier.name}') with a "
                         "LoadedModel, or calibration=codeckv.cache.calibration.calibration_for(loaded, tier)")
    if isinstance(calibration, Deferred):  # resolved at the first archive (the checks then), its shares once
        shares = functools.cache(lambda: _shares(calibration.resolve(), layer_types, layers))
        return lambda index: PCALayer(tier, None, raw_until=raw_until,
                                      later=lambda: (calibration.resolve().coders[index], shares()[index]))
    shares = _shares(calibration, layer_types, layers)
    return lambda index: PCALayer(tier, calibration.coders[index], shares[index], raw_until)


def _shares(calibration: Calibration, layer_types: list[str], layers: list[int]) -> dict[int, float]:
    """Each of `layers`' share of the budget (budget_shares), once the calibration has a coder for every
    full-attention layer of this model."""
    missing = [i for i, kind in enumerate(layer_types) if kind == "full_attention" and i not in calibration.coders]
    if missing:
        raise ValueError(f"the calibration of '{calibration.model}' has no coder for full-attention layers {missing} "
                         f"of this model (allowed: the model it was calibrated on)")
    return budget_shares(calibration, layers)


def make_cache(source, tier: Tier | str, materialization_free: bool | None = None,
               calibration: Calibration | None = None, attention_mask: torch.Tensor | None = None,
               per_layer: dict | None = None, raw_until: int | None = 0, press_mode: str = "once",
               **overrides) -> Cache:
    """A fresh cache for `tier`: transformers' DynamicCache for a native tier, else a CodecCache.

    materialization_free: None (default) = attention on the stored codes wherever the tier allows
    (view_reason says why not), False = keep a decoded view, True = on the codes.
    raw_until: 0 (default) = archive from the first complete unit (what a measurement of the codec wants); None =
    each layer holds its tokens raw until the tier's archive pays off (its own N, cache/layers.py "Raw until N":
    what the app's Chat and `python -m codeckv memory` build, so a short chat never holds more than native); or
    any token count.

    source: a model config, or a LoadedModel (codeckv.load_model), from which a PCA tier's calibration is
    loaded or computed when none is given (codeckv.cache.calibration.calibration_for).
    attention_mask: the (B, T) mask of a left-padded batch, so that codecs leave the pad tokens out.
    per_layer: {layer index: tier or preset name} overriding `tier` on those layers (codeckv/cache/schedule.py).
    press_mode: when a tier's press evicts (codeckv/presses/base.py): "once" (default, kvpress's protocol) = the
    context, the first forward into the empty cache, is pressed after its attention and nothing after it; "chunked"
    = every prefill chunk as it arrives (memory-bounded streaming).
    """
    check_press_mode(press_mode)
    tier = tier if isinstance(tier, Tier) else as_tier(tier)  # a Tier travels as it is; a name is resolved once
    if per_layer:
        tier = schedule(tier, per_layer)
    config = source.model.config if isinstance(source, LoadedModel) else source
    if tier.is_native:
        return DynamicCache(config=config)
    if calibration is None and isinstance(source, LoadedModel):
        calibration = calibration_for(source, tier)
    cache = CodecCache.from_config(config, tier, materialization_free, calibration, raw_until, **overrides)
    cache.set_press_mode(press_mode)
    if attention_mask is not None:
        cache.set_left_padding(attention_mask)
    return cache


def footprint(cache: Cache) -> Footprint:
    """Bytes held by any cache: a CodecCache, or a native DynamicCache (whose archive is what it holds).

    The totals count a CodecCache's codec layers (and a full-attention layer a schedule leaves native), and every
    layer of a native cache that holds keys and values; the other layers are counted apart (native_layer_bytes).
    """
    result = Footprint()
    native = not isinstance(cache, CodecCache)
    for index, layer in enumerate(cache.layers):
        if isinstance(layer, CodecLayer):
            result.layers.append(layer.footprint(index))
        else:
            counted = type(layer) is DynamicLayer or (native and isinstance(layer, DynamicLayer))
            result.layers.append(_native_footprint(index, layer, counted))
    return result


def held_bytes(cache: Cache) -> int:
    """Bytes of every tensor `cache` owns now (design.md "held"): archives, raw tokens, decoded views, slack.

    Cheap (nothing is flushed or decoded), so a run can read it after every forward to find its peak.
    """
    total = 0
    for layer in cache.layers:
        if isinstance(layer, CodecLayer):
            total += layer.held_bytes()
        else:
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                total += 0 if t is None else t.numel() * t.element_size()
    return total


def _native_footprint(index: int, layer, counted: bool) -> LayerFootprint:
    """A native layer: what it holds is both its archive and its resident bytes, every token raw."""
    kind = type(layer).__name__
    full_attention = counted
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    if keys is None or keys.numel() == 0:
        return LayerFootprint(index, kind, full_attention, 0, 0, 0, 0)
    held = keys.numel() * keys.element_size() + values.numel() * values.element_size()
    bf16 = (keys.numel() + values.numel()) * 2
    return LayerFootprint(index, kind, full_attention, keys.shape[2], held, held, bf16, tail_tokens=keys.shape[2])


@torch.inference_mode()
def steady_state_ratio(tier: Tier | str, head_dim: int, dtype: torch.dtype = torch.bfloat16) -> float:
    """Bytes per archived token / bf16 bytes per token, measured through a real CodecLayer (1.0 if native).

    One archive unit of random tokens goes through the layer, so scales, zeros and the unit's
    rounding are all counted. For codecs whose stored size depends on the data (entropy-coded ones)
    this is only an estimate: read `Footprint.steady_state_ratio` of a real cache instead.
    """
    tier = as_tier(tier)
    if tier.is_native:
        return 1.0
    if tier.per_layer:
        raise ValueError(f"tier '{tier.name}' is a per-layer schedule: its ratio depends on the model's layers, read "
                         "Footprint.steady_state_ratio of a real cache (allowed: a plain tier)")
    if tier.joint is not None:
        raise ValueError(f"tier '{tier.name}' stores entropy-coded, calibrated codes: its ratio depends on the model "
                         "and the text, read Footprint.steady_state_ratio of a real cache (allowed: a per-tensor tier)")
    layer = CodecLayer(dataclasses.replace(tier, keep_first=0, keep_recent=0))
    x = torch.randn(1, 1, layer.unit, head_dim, generator=torch.Generator().manual_seed(0)).to(dtype)
    layer.update(x, x.clone())
    layer.flush()
    return layer.footprint(0).code_bytes / (layer.unit * 2 * head_dim * 2)
