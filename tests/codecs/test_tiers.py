"""Tier tests: per-tier error bounds on a KV-like signal, byte targets, lookup and custom tiers."""

from __future__ import annotations

import pytest
import torch

from codeckv.cache import steady_state_ratio
from codeckv.cache.layers import CodecLayer
from codeckv.codecs import DCT, GroupQuant, LloydMaxQuant, Rotation
from codeckv.codecs.fp8 import CALIBRATED
from codeckv.custom_tier import custom_tier
from codeckv.tiers import TIERS, Tier, as_tier, get_tier

OUTLIER_CHANNELS = [3, 17, 40]


def kv_signal(shape: tuple[int, int, int, int] = (1, 2, 128, 64), seed: int = 0) -> torch.Tensor:
    """The test signal of every tier's max_rel_error: a smooth random walk along the sequence,
    a per-channel offset, noise, and a few channels 10x larger (like key outlier channels)."""
    g = torch.Generator().manual_seed(seed)
    b, h, _, d = shape
    walk = (0.2 * torch.randn(shape, generator=g)).cumsum(2)
    offset = torch.randn(b, h, 1, d, generator=g)
    x = walk + offset + 0.1 * torch.randn(shape, generator=g)
    gain = torch.ones(d)
    gain[OUTLIER_CHANNELS] = 10.0
    return x * gain


def relative_error(codec, x: torch.Tensor) -> float:
    y = codec.decode(codec.encode(x))
    return ((y.float() - x.float()).norm() / x.float().norm()).item()


@pytest.mark.parametrize("side", ["key", "value"])
@pytest.mark.parametrize("name", TIERS)
def test_tier_error_bound(name: str, side: str) -> None:
    tier = TIERS[name]
    codec = getattr(tier, side)
    if tier.joint is not None:
        pytest.skip(f"{name} codes K and V jointly with a per-model calibration (tests/cache/test_pca.py)")
    if codec is None:
        pytest.skip(f"{name} stores {side}s natively")
    if getattr(codec, "scale", None) == CALIBRATED:
        pytest.skip(f"{name} takes each model's FP8 scales (tests/cache/test_kv_scales.py)")
    err = relative_error(codec, kv_signal())
    assert err <= tier.max_rel_error, f"{name}.{side}: relative error {err:.4f} > bound {tier.max_rel_error}"


@pytest.mark.parametrize("name", TIERS)
def test_tier_is_well_formed(name: str) -> None:
    tier = get_tier(name)
    assert tier.name == name
    assert tier.description and "\n" not in tier.description
    assert tier.is_native == (name == "native")


def test_get_tier_lists_names() -> None:
    with pytest.raises(ValueError, match="turbo-4") as info:
        get_tier("turbo-5")
    assert all(name in str(info.value) for name in TIERS)


def test_as_tier_takes_tiers_and_names() -> None:
    assert as_tier("turbo-4") is TIERS["turbo-4"] and as_tier(TIERS["png"]) is TIERS["png"]
    with pytest.raises(ValueError, match="neither a Tier nor a tier name"):
        as_tier(4)


BYTE_TARGETS = [  # (tier, head_dim, max steady-state ratio vs bf16, metadata included)
    ("native", 64, 1.0),
    ("png", 64, 1.0),
    ("jpeg-k8-int8", 64, 0.55),
    ("int8", 64, 0.57),
    ("turbo-4", 64, 0.32),
    ("turbo-4", 128, 0.32),
    ("turbo-3", 64, 0.25),
    ("turbo-k4v2", 64, 0.25),
    ("jpeg-k2-int8", 64, 0.14),
    ("jpeg-k4", 64, 0.50),  # bf16 coefficients, whatever the model dtype (fp32 on CPU)
    ("jpeg-k2", 64, 0.25),
    ("fp8-e4m3", 64, 0.50),  # one byte a value, nothing else stored: the scale is the tier's
    ("fp8-e5m2", 128, 0.50),
    ("nvfp4", 64, 0.282),  # 4 bits + an 8-bit scale per 16 values: 4.5 bits
    ("mxfp4", 64, 0.266),  # 4 bits + an 8-bit scale per 32 values: 4.25 bits
]


@pytest.mark.parametrize("name, head_dim, target", BYTE_TARGETS)
def test_byte_targets(name: str, head_dim: int, target: float) -> None:
    ratio = steady_state_ratio(TIERS[name], head_dim)
    assert ratio <= target, f"{name}: {ratio:.3f} of bf16 at head_dim {head_dim} > target {target}"


def test_steady_state_counts_the_archive_unit_and_metadata() -> None:
    # int8 per token, group 32: per token 64 codes + 2 groups x (scale, zero) fp16, K and V; unit 8 tokens.
    assert steady_state_ratio("int8", 64) == pytest.approx((64 + 2 * 2 * 2) / (64 * 2))
    assert steady_state_ratio("native", 64) == 1.0


def test_footprint_counts_raw_tokens_and_says_which() -> None:
    # 4 sinks + 12 recent raw in fp32; 48 tokens archived per channel in groups of 16 (unit 16):
    # codes 48 x 64 B, scale and zero (3, 64) fp16 each, for K and for V. Reference: 2 x 64 x 64 x 2 B.
    quant = GroupQuant(bits=8, group=16, per_channel=True)
    layer = CodecLayer(Tier("w", "windows", key=quant, value=quant, keep_first=4, keep_recent=12))
    x = torch.randn(1, 1, 64, 64)
    layer.update(x, x.clone())
    fp = layer.footprint(0)
    codes = 2 * (48 * 64 + 2 * 3 * 64 * 2)
    assert (fp.archived_tokens, fp.sink_tokens, fp.window_tokens, fp.tail_tokens) == (48, 4, 12, 0)
    assert fp.code_bytes == codes
    assert fp.archive_bytes == codes + 16 * 2 * 64 * 4
    assert fp.bf16_bytes == 2 * 64 * 64 * 2
    assert fp.archived_bf16_bytes == 2 * 48 * 64 * 2


CUSTOM = [  # (custom_tier kwargs, expected key codec, expected value codec)
    ({}, None, None),
    ({"k": 4}, DCT(k=4), DCT(k=4)),
    ({"bits": 8, "group": 64, "k": 8}, DCT(coeffs=GroupQuant(8, 64)), DCT(coeffs=GroupQuant(8, 64))),
    ({"bits": 3, "rotation": True}, Rotation(GroupQuant(3)), Rotation(GroupQuant(3))),
    (
        {"bits": 4, "value_bits": 2, "lloyd_max": True, "rotation": True, "per_channel_keys": True},
        GroupQuant(4, per_channel=True),
        Rotation(LloydMaxQuant(2)),
    ),
    (
        {"block_size": 4, "k": 2, "bits": 4, "group": 16, "lloyd_max": True},
        DCT(4, 2, LloydMaxQuant(4, 16)),
        DCT(4, 2, LloydMaxQuant(4, 16)),
    ),
]


@pytest.mark.parametrize("kwargs, key, value", CUSTOM)
def test_custom_tier_builds_codecs(kwargs: dict, key, value) -> None:
    tier = custom_tier(**kwargs)
    assert (tier.key, tier.value) == (key, value)
    assert tier.description and "\n" not in tier.description
    x = kv_signal()
    for codec in (tier.key, tier.value):
        if codec is not None:
            assert relative_error(codec, x) < 1.0


def test_custom_tier_reproduces_turbo_4() -> None:
    """The presets are plain data: the Advanced knobs rebuild them exactly."""
    tier = custom_tier(bits=4, rotation=True, lloyd_max=True, per_channel_keys=True, keep_first=2, keep_recent=8)
    assert (tier.key, tier.value) == (TIERS["turbo-4"].key, TIERS["turbo-4"].value)
    assert (tier.keep_first, tier.keep_recent) == (2, 8)


INVALID_CUSTOM = [  # (custom_tier kwargs, expected message fragment)
    ({"bits": 5}, r"allowed: \(None, 2, 3, 4, 8\)"),
    ({"bits": 4, "value_bits": 1}, r"allowed: \(None, 2, 3, 4, 8\)"),
    ({"value_bits": 4}, r"needs quantization \(allowed bits: \(2, 3, 4, 8\)\)"),
    ({"rotation": True}, "rotation needs quantization"),
    ({"lloyd_max": True}, "lloyd_max needs quantization"),
    ({"per_channel_keys": True}, "per_channel_keys needs quantization"),
    ({"k": 9}, r"allowed: \[1, 2, 3, 4, 5, 6, 7, 8\]"),
    ({"k": 2, "block_size": 0}, "block_size=0 must be a whole number in 1..64"),
    ({"bits": 4, "group": 0}, "group=0 must be a positive integer"),
    ({"keep_first": -1}, r"keep_first=-1 must be an integer in 0\.\.1048576"),
    ({"bits": 4, "keep_recent": 2.5}, r"keep_recent=2.5 must be an integer in 0\.\.1048576"),
    ({"bits": 4, "keep_recent": 10**9}, r"keep_recent=1000000000 must be an integer in 0\.\.1048576"),
]


@pytest.mark.parametrize("kwargs, message", INVALID_CUSTOM)
def test_custom_tier_rejects_impossible_settings(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        custom_tier(**kwargs)


def test_tier_rejects_non_codecs() -> None:
    with pytest.raises(ValueError, match="not a codec"):
        Tier("bad", "a string is not a codec", key="int8")
    with pytest.raises(ValueError, match="max_rel_error"):
        Tier("bad", "negative bound", max_rel_error=-1.0)
