"""Codec tiers: named (key codec, value codec) pairs, or a joint K+V coder; the only place tiers are defined.

A tier is data: its codecs are configured instances, so behaviour never depends on
its name. `TIERS` holds the presets the app and the CLI sweep; `custom_tier` (codeckv/custom_tier.py) builds
one from the knobs of the app's "Advanced" panel. Each preset declares beside it
`max_rel_error`, the bound its round trip must meet on the test signal of
tests/codecs (a random-walk KV-like tensor with noise and outlier channels).

Why the turbo tiers and int8 quantize keys per channel without rotating them: key
outliers sit in fixed channels and vary slowly along the sequence, so per-channel
groups of tokens (KIVI) fit them best, and a rotation would smear them into every
coordinate. On Qwen2.5-Coder-0.5B, whose k_proj bias gives a few key channels
values far above the rest, per-token int8 groups spent their range on those channels
(KLD 0.0023 on Genesis); per-channel keys at the same bytes gave 0.00001, a Hadamard
rotation before per-token groups 0.0004; rotated-4, whose keys were rotated onto per-token
4-bit groups, collapsed there (KLD 1.92) and now keeps its keys per channel as well
(docs/quality.md, "Outlier keys"). Values have
no such structure; a random Hadamard rotation makes them Gaussian, where Lloyd-Max
levels with one searched fp16 scale per group win.

The pca tiers code keys and values of a layer together (`joint`, codecs/pca.py): their redundancy lies
across channels and heads, not along the sequence, and a calibrated per-layer basis finds it. They
need a calibration per model (codeckv/cache/calibration.py), which the cache loads by itself.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from codeckv.codecs.base import Codec
from codeckv.codecs.cast import Cast
from codeckv.codecs.dct import DCT
from codeckv.codecs.delta import Delta
from codeckv.codecs.fit import for_head_dim
from codeckv.codecs.fp4 import FP4
from codeckv.codecs.fp8 import CALIBRATED, FP8
from codeckv.codecs.lloyd_max import LloydMaxQuant
from codeckv.codecs.pca import JointPCA
from codeckv.codecs.quant import GroupQuant
from codeckv.codecs.rotation import Rotation
from codeckv.codecs.vllm_tq_keys import TQKeys
from codeckv.codecs.vllm_tq_values import TQValues
from codeckv.presses import (
    PRESSES,
    RATIOS,
    Budget,
    Decoding,
    KnormPress,
    Press,
    SnapKVPress,
    StreamingLLMPress,
    TOVAPress,
)

MAX_RAW_TOKENS = 1 << 20  # keep_first / keep_recent at most: far past any context a cache here holds


def _check_count(value: int, name: str) -> None:
    """Raise ValueError unless value is an integer in 0..MAX_RAW_TOKENS."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RAW_TOKENS:
        raise ValueError(f"{name}={value!r} must be an integer in 0..{MAX_RAW_TOKENS} (0 = off)")


@dataclass(frozen=True)
class Tier:
    """A key codec and a value codec (None = stored natively), or a joint coder, plus full-precision windows."""

    name: str
    description: str  # one line, shown in the UI
    key: Codec | None = None
    value: Codec | None = None
    keep_first: int = 0  # sink tokens kept at full precision
    keep_recent: int = 0  # most recent tokens kept at full precision
    max_rel_error: float = math.inf  # bound on ||decode(encode(x)) - x|| / ||x|| on the test signal
    joint: JointPCA | None = None  # keys and values of a layer coded together (calibrated per model), no key/value
    per_layer: tuple[tuple[int, Tier], ...] = ()  # (layer index, tier) overriding this tier there (cache/schedule.py)
    press: Press | None = None  # which tokens each layer keeps (codeckv/presses); the codecs store the kept ones
    boundary: int = 0  # the first and last `boundary` layers keep their native cache on a model without linear
    # attention (vLLM's get_boundary_skip_layers; cache/schedule.py with_boundary turns it into a schedule)

    def __post_init__(self) -> None:
        for side, codec in (("key", self.key), ("value", self.value)):
            if codec is not None and not isinstance(codec, Codec):
                raise ValueError(f"Tier {self.name!r}: {side}={codec!r} is not a codec (allowed: None or a codec)")
        if self.joint is not None and not isinstance(self.joint, JointPCA):
            raise ValueError(f"Tier {self.name!r}: joint={self.joint!r} is not a JointPCA (allowed: None, a JointPCA)")
        if self.joint is not None and (self.key is not None or self.value is not None):
            raise ValueError(f"Tier {self.name!r}: a joint coder codes keys and values itself (allowed: no key/value)")
        if self.press is not None and not isinstance(self.press, Press):
            raise ValueError(f"Tier {self.name!r}: press={self.press!r} is not a press (allowed: None, a "
                             "codeckv.presses press)")
        if self.press is not None and self.joint is not None:
            raise ValueError(f"Tier {self.name!r}: a PCA tier removes RoPE at each token's position, which a press's "
                             "eviction loses (allowed: a press with a per-tensor tier)")
        if isinstance(self.press, Budget) and self.key is not None:
            raise ValueError(f"Tier {self.name!r}: a token budget evicts tokens the layer already holds, which a "
                             "codec's archive cannot give back (allowed: a budget on a press alone, its tokens raw)")
        if self.press is not None and (self.key is None) != (self.value is None):
            raise ValueError(f"Tier {self.name!r}: a press stores the kept tokens raw or through both codecs "
                             "(allowed: key and value codecs, or neither)")
        _check_count(self.keep_first, f"Tier {self.name!r}: keep_first")
        _check_count(self.keep_recent, f"Tier {self.name!r}: keep_recent")
        if not self.max_rel_error >= 0:
            raise ValueError(f"Tier {self.name!r}: max_rel_error={self.max_rel_error!r} must be >= 0")
        if isinstance(self.boundary, bool) or not isinstance(self.boundary, int) or not 0 <= self.boundary <= 64:
            raise ValueError(f"Tier {self.name!r}: boundary={self.boundary!r} must be a whole number of layers "
                             "in 0..64")
        if self.boundary and self.per_layer:
            raise ValueError(f"Tier {self.name!r}: boundary layers and a per-layer schedule together (allowed: one; "
                             "a schedule can name the native layers itself)")
        indices = [entry[0] if isinstance(entry, tuple) and len(entry) == 2 else None for entry in self.per_layer]
        for index, entry in zip(indices, self.per_layer):
            if isinstance(index, bool) or not isinstance(index, int) or index < 0 or not isinstance(entry[1], Tier):
                raise ValueError(f"Tier {self.name!r}: per_layer entry {entry!r} is not (layer index >= 0, Tier)")
            if entry[1].per_layer:
                raise ValueError(f"Tier {self.name!r}: the tier of layer {index} has a schedule of its own "
                                 "(allowed: plain tiers per layer)")
        if indices != sorted(set(indices)):
            raise ValueError(f"Tier {self.name!r}: per_layer indices {indices} must be distinct and in order")

    @property
    def is_native(self) -> bool:
        """True when neither keys nor values are encoded, on any layer."""
        plain = self.key is None and self.value is None and self.joint is None and self.press is None
        return plain and all(tier.is_native for _, tier in self.per_layer)

    @property
    def evicts(self) -> bool:
        """True when a press evicts tokens on some layer: such a cache must take its prefill itself (the press scores
        each chunk in attention), not be converted from a native one."""
        return self.press is not None or any(tier.press is not None for _, tier in self.per_layer)

    @property
    def coded(self) -> bool:
        """True when some layer stores its tokens through a codec (a key/value pair or a joint coder); False for
        native and a press alone, whose tokens stay as the model made them."""
        return self.key is not None or self.joint is not None or any(tier.coded for _, tier in self.per_layer)

    def for_head_dims(self, key_dim: int, value_dim: int) -> Tier:
        """This tier with its codecs fitted to keys of key_dim and values of value_dim channels (codecs/fit.py):
        itself where they fit already (every preset on head_dim 64, 128, 256)."""
        key, value = for_head_dim(self.key, key_dim), for_head_dim(self.value, value_dim)
        if key is self.key and value is self.value:
            return self
        return dataclasses.replace(self, key=key, value=value)

    def tier_at(self, index: int) -> Tier:
        """The plain tier of model layer `index`: its per_layer entry, else this tier without the schedule."""
        for layer, tier in self.per_layer:
            if layer == index:
                return tier
        return dataclasses.replace(self, per_layer=()) if self.per_layer else self


def _tiers(*tiers: Tier) -> dict[str, Tier]:
    """Index tiers by name."""
    return {t.name: t for t in tiers}


def _turbo(name: str, key_bits: int, value_bits: int, max_rel_error: float) -> Tier:
    """Keys per channel in groups of 32 tokens (KIVI), values rotated with Lloyd-Max levels (module docstring)."""
    return Tier(
        name,
        f"K {key_bits}-bit per channel (32 tokens), V rotated {value_bits}-bit Lloyd-Max (group 32)",
        key=GroupQuant(bits=key_bits, group=32, per_channel=True),
        value=Rotation(inner=LloydMaxQuant(bits=value_bits, group=32)),
        max_rel_error=max_rel_error,
    )


def _vllm_tq(preset: str, key_bits: int, value_bits: int) -> Tier:
    """vLLM's `--kv-cache-dtype turboquant_<preset>` (vllm/model_executor/layers/quantization/turboquant/config.py,
    TQ_PRESETS): keys FP8 (8 bits) or rotated Lloyd-Max with norm correction (codecs/vllm_tq_keys.py), values on a
    uniform grid per vector (codecs/vllm_tq_values.py), the first and last 2 layers native as vLLM keeps them on a
    dense model (TurboQuantConfig.get_boundary_skip_layers)."""
    if key_bits == 8:
        key, keys = FP8("e4m3"), "K FP8 E4M3"
    else:
        key, keys = TQKeys(bits=key_bits), f"K rotated {key_bits}-bit Lloyd-Max + fp16 norm, norm-corrected"
    description = f"vLLM's turboquant_{preset.replace('-', '_')}: {keys}, V {value_bits}-bit uniform per vector " \
                  f"(fp16 scale, zero){boundary_text(VLLM_BOUNDARY)}"
    return Tier(f"vllm-tq-{preset}", description, key=key, value=TQValues(bits=value_bits), boundary=VLLM_BOUNDARY,
                max_rel_error=VLLM_TQ_ERRORS[preset])


def boundary_text(layers: int) -> str:
    """What a tier's boundary does, as the end of its description."""
    return f"; first and last {layers} layers native" if layers else ""


SKIP = re.compile(r"^(?P<base>.+)-skip(?P<layers>\d{1,2})$")  # "turbo-3-skip2": turbo-3, its boundary layers native


def with_boundary(tier: Tier, layers: int) -> Tier:
    """`tier` with its first and last `layers` layers native (vLLM's --kv-cache-dtype-skip-layers rule on a dense model;
    0: every layer coded), named "<tier>-skip<layers>": turbo-3-skip2, vllm-tq-3bit-nc-skip0."""
    if tier.per_layer or tier.is_native or tier.joint is not None:
        raise ValueError(f"'{tier.name}' cannot keep boundary layers native (allowed: a per-tensor or press tier "
                         "without a schedule)")
    base = tier.description.removesuffix(boundary_text(tier.boundary))
    return dataclasses.replace(tier, name=f"{tier.name}-skip{layers}", boundary=layers,
                               description=base + (boundary_text(layers) or "; every layer coded"))


VLLM_BOUNDARY = 2  # vLLM's get_boundary_skip_layers(n=2)
VLLM_TQ_ERRORS = {"k8v4": 0.17, "4bit-nc": 0.17, "k3v4-nc": 0.18, "3bit-nc": 0.36}  # on the test signal: one min/max a
# vector spends its 4-bit grid on the signal's 10x outlier channels (values 0.16, 3-bit 0.35; turbo-4's 0.07)


def _pca(name: str, bits_per_element: float) -> Tier:
    """Joint K+V PCA per layer, keys without RoPE, Fisher-whitened, ECSQ, ANS-coded (codecs/pca.py).

    bits_per_element is the budget the rate control keeps on any text (codecs/rate.py): everything the
    archive stores, per K/V element; 2, 1 and 0.5 bits are 1/8, 1/16 and 1/32 of a bf16 cache.
    """
    return Tier(
        name,
        f"Joint K+V PCA per layer (keys de-rotated, Fisher-whitened), {bits_per_element:g} bits/element "
        "entropy-coded (ANS), step per chunk within the budget; calibrated per model",
        joint=JointPCA(bits_per_element=bits_per_element),
    )


# press name -> what it keeps, in the tiers' descriptions (codeckv/presses: each as kvpress 0.5.5's press of the name)
PRESS_METHODS = {
    "streamingllm": "StreamingLLM (4 sinks + the newest tokens)",
    "snapkv": "SnapKV (attention of the last 64 queries, pooled)",
    "knorm": "Key norm (the smallest keys)",
    "tova": "TOVA (attention of the last query, all heads)",
    "expected": "Expected attention (of the coming queries; 4 sinks)",
}


def ratio_tag(ratio: float) -> str:
    """A share evicted as a tier name's suffix: 0.25 -> "25", 0.875 -> "875"."""
    return f"{ratio * 100:g}".replace(".", "")


def _press(name: str, press: Press, how: str) -> Tier:
    """A press alone: it evicts `press.ratio` of the prefill's tokens (make_cache's press_mode says when), the kept
    ones stay raw."""
    return Tier(name, f"{how}: evicts {press.ratio:.1%} of the prefill's tokens, keeps the rest raw".replace(
        ".0%", "%"), press=press, max_rel_error=0.0)


def _budget(name: str, press: Press, how: str, tokens: int = 256) -> Tier:
    """A press that keeps at most `tokens` per layer, decoding included (presses/budget.py), its tokens raw."""
    budget = Budget(press=press, tokens=tokens)
    return Tier(name, f"{how}: at most {tokens} tokens per layer, pressed back to {tokens} after a prefill chunk and "
                      f"every {budget.interval} decode steps past it; keeps them raw", press=budget, max_rel_error=0.0)


def _decoding(name: str, press: Press, how: str, tokens: int = 256, share: float = 0.0) -> Tier:
    """kvpress's DecodingPress (or, with `share`, CompressionRatioDecodingPress) around `press`: the prompt kept
    whole, every 16 decoding steps compressed to `tokens` (or to 1 - share of the tokens seen), kept raw
    (presses/decoding.py)."""
    decoding = Decoding(press=press, tokens=tokens, share=share)
    target = f"{1 - share:.0%} of the tokens seen" if share else f"{tokens} tokens per layer"
    return Tier(name, f"{how}, while decoding (kvpress's {'CompressionRatio' if share else ''}DecodingPress): the "
                      f"prompt kept whole, every {decoding.interval} decoding steps compressed to {target}; keeps "
                      "them raw", press=decoding, max_rel_error=0.0)


def compose(press_tier: Tier, codec_tier: Tier) -> Tier:
    """A press tier's press over a per-tensor codec tier: "snapkv-50+turbo-4" keeps SnapKV's tokens stored as turbo-4
    stores them (presses/base.py). Refused for a PCA or native codec tier, or a first tier without a press."""
    if press_tier.press is None or press_tier.key is not None or isinstance(press_tier.press, Budget):
        composable = (n for n, t in TIERS.items() if t.press is not None and t.key is None
                      and not isinstance(t.press, Budget))
        raise ValueError(f"'{press_tier.name}' is not a press tier that evicts at prefill (a token budget keeps its "
                         f"tokens raw; allowed before '+': {', '.join(composable)})")
    if codec_tier.key is None or codec_tier.press is not None or codec_tier.per_layer or codec_tier.boundary:
        codecs = (n for n, t in TIERS.items() if t.key is not None and t.press is None and not t.boundary)
        raise ValueError(f"'{codec_tier.name}' is not a per-tensor codec tier on every layer (allowed after '+': "
                         f"{', '.join(codecs)})")
    return dataclasses.replace(codec_tier, name=f"{press_tier.name}+{codec_tier.name}",
                               description=f"{press_tier.description.split(':')[0]} {press_tier.press.ratio:.0%} "
                                           f"evicted, the kept tokens stored as {codec_tier.name}: "
                                           f"{codec_tier.description}",
                               press=press_tier.press)


def pca_tier(bits_per_element: float) -> Tier:
    """A PCA tier at any bit budget (the quality CLI's --pca-bits frontier), named e.g. pca-1.5b."""
    return _pca(f"pca-{bits_per_element:g}b", bits_per_element)


TIERS: dict[str, Tier] = _tiers(
    Tier("native", "Native cache, no compression", max_rel_error=0.0),
    Tier(
        "png",
        "Lossless: per-block anchor + bit-pattern deltas (r=8); saving shows after zstd",
        key=Delta(block_size=8),
        value=Delta(block_size=8),
        max_rel_error=0.0,
    ),
    Tier(
        "jpeg-k8-int8",
        "DCT r=8, all 8 frequencies, coefficients 8-bit: K's per channel (4 blocks), V's per row (group 64)",
        key=DCT(block_size=8, k=8, coeffs=GroupQuant(bits=8, group=32, per_channel=True)),
        value=DCT(block_size=8, k=8, coeffs=GroupQuant(bits=8, group=64)),
        max_rel_error=0.012,
    ),
    Tier(
        "jpeg-k4",
        "DCT r=8, keep the 4 lowest frequencies, coefficients in bf16",
        key=DCT(block_size=8, k=4, coeffs=Cast("bfloat16")),
        value=DCT(block_size=8, k=4, coeffs=Cast("bfloat16")),
        max_rel_error=0.07,
    ),
    Tier(
        "jpeg-k2",
        "DCT r=8, keep the 2 lowest frequencies, coefficients in bf16",
        key=DCT(block_size=8, k=2, coeffs=Cast("bfloat16")),
        value=DCT(block_size=8, k=2, coeffs=Cast("bfloat16")),
        max_rel_error=0.1,
    ),
    Tier(
        "jpeg-k2-int8",
        "DCT r=8, keep the 2 lowest frequencies, coefficients 8-bit (group 64)",
        key=DCT(block_size=8, k=2, coeffs=GroupQuant(bits=8, group=64)),
        value=DCT(block_size=8, k=2, coeffs=GroupQuant(bits=8, group=64)),
        max_rel_error=0.1,
    ),
    Tier(
        "int8",
        "K 8-bit min/max per channel (32 tokens), V 8-bit min/max per token (groups of 32 channels)",
        key=GroupQuant(bits=8, group=32, per_channel=True),
        value=GroupQuant(bits=8, group=32),
        max_rel_error=0.01,
    ),
    Tier(
        "fp8-e4m3",
        "FP8 E4M3, one byte a value, static scale 1.0: vLLM's and SGLang's kv_cache_dtype=\"fp8\" default",
        key=FP8("e4m3"),
        value=FP8("e4m3"),
        max_rel_error=0.03,
    ),
    Tier(
        "fp8-e4m3-cal",
        "FP8 E4M3 with a static scale per layer and KV head, calibrated as llm-compressor does (absmax / 448 over "
        "calibration text); calibrated per model",
        key=FP8("e4m3", scale=CALIBRATED),
        value=FP8("e4m3", scale=CALIBRATED),
    ),
    Tier(
        "fp8-e5m2",
        "FP8 E5M2, one byte a value, static scale 1.0: vLLM's kv_cache_dtype=\"fp8_e5m2\"",
        key=FP8("e5m2"),
        value=FP8("e5m2"),
        max_rel_error=0.06,
    ),
    Tier(
        "nvfp4",
        "NVFP4: E2M1 in blocks of 16 channels, an E4M3 scale each (per-tensor scale 1.0): Blackwell's KV format "
        "in TensorRT-LLM",
        key=FP4(block=16, scale_format="e4m3"),
        value=FP4(block=16, scale_format="e4m3"),
        max_rel_error=0.11,
    ),
    Tier(
        "mxfp4",
        "MXFP4 (OCP microscaling): E2M1 in blocks of 32 channels, a power-of-two (E8M0) scale each",
        key=FP4(block=32, scale_format="e8m0"),
        value=FP4(block=32, scale_format="e8m0"),
        max_rel_error=0.2,
    ),
    Tier(
        "rotated-4",
        "Baseline: turbo-4 without Lloyd-Max levels: K 4-bit per channel (32 tokens), V rotated 4-bit min/max "
        "(group 32)",
        key=GroupQuant(bits=4, group=32, per_channel=True),
        value=Rotation(inner=GroupQuant(bits=4, group=32)),
        max_rel_error=0.12,
    ),
    _turbo("turbo-4", key_bits=4, value_bits=4, max_rel_error=0.09),
    _turbo("turbo-3", key_bits=3, value_bits=3, max_rel_error=0.18),
    _turbo("turbo-k4v2", key_bits=4, value_bits=2, max_rel_error=0.35),
    _vllm_tq("k8v4", key_bits=8, value_bits=4),
    _vllm_tq("4bit-nc", key_bits=4, value_bits=4),
    _vllm_tq("k3v4-nc", key_bits=3, value_bits=4),
    _vllm_tq("3bit-nc", key_bits=3, value_bits=3),
    *(_press(f"{name}-{ratio_tag(ratio)}", PRESSES[name](ratio), how) for name, how in PRESS_METHODS.items()
      for ratio in RATIOS),
    _budget("streamingllm-budget256", StreamingLLMPress(), "StreamingLLM (4 sinks + the newest tokens)"),
    _budget("tova-budget256", TOVAPress(), "TOVA (attention of the last query)"),
    _budget("snapkv-budget256", SnapKVPress(), "SnapKV (attention of the last 64 queries, pooled)"),
    _decoding("streamingllm-decoding256", StreamingLLMPress(), "StreamingLLM (4 sinks + the newest tokens)"),
    _decoding("tova-decoding256", TOVAPress(), "TOVA (attention of the last query)"),
    _decoding("knorm-decoding256", KnormPress(), "Key norm (the lowest L2 norms kept)"),
    _decoding("tova-decoding-50", TOVAPress(), "TOVA (attention of the last query)", share=0.5),
    _pca("pca-5x", 3.2),
    _pca("pca-8x", 2.0),
    _pca("pca-16x", 1.0),
    _pca("pca-32x", 0.5),
)


TIERS.update({t.name: t for t in (compose(TIERS["snapkv-50"], TIERS["turbo-4"]),
                                   compose(TIERS["snapkv-75"], TIERS["turbo-4"]))})  # the two families together
# (any other press+codec pair, "snapkv-875+turbo-4" say, is composed on request: get_tier)


def get_tier(name: str) -> Tier:
    """TIERS[name], a press tier composed with a codec tier ("snapkv-50+turbo-4": compose), or a ValueError listing
    the tier names."""
    if name in TIERS:
        return TIERS[name]
    press, plus, codec = name.partition("+") if isinstance(name, str) else ("", "", "")
    if plus and press in TIERS and codec in TIERS:
        return compose(TIERS[press], TIERS[codec])
    skip = SKIP.match(name) if isinstance(name, str) else None
    if skip and skip["base"] in TIERS:
        return with_boundary(TIERS[skip["base"]], int(skip["layers"]))
    raise ValueError(f"unknown tier {name!r} (allowed: {', '.join(TIERS)}, press+tier such as snapkv-50+turbo-4, or "
                     "tier-skipN such as turbo-3-skip2: its first and last N layers native)")


def as_tier(tier: Tier | str) -> Tier:
    """A Tier from a Tier or a preset name: what every public entry point accepts."""
    if isinstance(tier, Tier):
        return tier
    if isinstance(tier, str):
        return get_tier(tier)
    raise ValueError(f"tier={tier!r} is neither a Tier nor a tier name (allowed: {', '.join(TIERS)})")
