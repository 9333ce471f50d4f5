"""Codec contract tests: round trip, honest nbytes, the concatenation rule, exactness and validation."""

from __future__ import annotations

import math

import pytest
import torch

from codeckv.codecs import (
    ALLOWED_BITS,
    DCT,
    Cast,
    Delta,
    Encoded,
    GroupQuant,
    LloydMaxQuant,
    Rotation,
    codebook,
    concat_encoded,
    dct_basis,
    pack_bits,
    unpack_bits,
)
from codeckv.codecs.fit import for_head_dim
from codeckv.codecs.fp4 import FP4
from codeckv.codecs.fp8 import CALIBRATED, FP8
from codeckv.tiers import TIERS

# Every codec of every tier (a model's calibrated FP8 scales: tests/codecs/test_formats.py), plus configurations no
# tier uses (odd groups, per-channel, nesting).
TIER_CODECS = {
    f"{name}.{side}": codec
    for name, tier in TIERS.items()
    for side, codec in (("key", tier.key), ("value", tier.value))
    if codec is not None and getattr(codec, "scale", None) != CALIBRATED
}
EXTRA_CODECS = {
    "gq2-g16": GroupQuant(bits=2, group=16),
    "gq3-g64": GroupQuant(bits=3, group=64),
    "gq8-pc8": GroupQuant(bits=8, group=8, per_channel=True),
    "lm8-pc16": LloydMaxQuant(bits=8, group=16, per_channel=True),
    "lm3-plain-rms": LloydMaxQuant(bits=3, group=32, scales=(1.0,), refit=False),
    "rot-gq4": Rotation(inner=GroupQuant(bits=4), seed=7),
    "dct-k4-bf16": DCT(block_size=8, k=4, coeffs=Cast("bfloat16")),
    "cast-fp16": Cast("float16"),
    "dct-k3-pc-inner": DCT(block_size=8, k=3, coeffs=GroupQuant(bits=4, group=4, per_channel=True)),
    "dct-k2-rot-lm": DCT(block_size=4, k=2, coeffs=Rotation(inner=LloydMaxQuant(bits=4))),
    "delta-r1": Delta(block_size=1),
    "delta-r3": Delta(block_size=3),
    "fp8-e5m2-scale": FP8("e5m2", scale=0.25),
    "fp4-b16-e8m0": FP4(block=16, scale_format="e8m0"),
}
CODECS = {**TIER_CODECS, **EXTRA_CODECS}
DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.bfloat16, id="bf16"),
    pytest.param(torch.float16, id="fp16"),
]


def random_kv(tokens: int, dtype: torch.dtype = torch.float32, seed: int = 0, head_dim: int = 64) -> torch.Tensor:
    """(2, 3, tokens, head_dim) random walk along tokens plus noise."""
    g = torch.Generator().manual_seed(seed)
    x = (0.3 * torch.randn(2, 3, tokens, head_dim, generator=g)).cumsum(2)
    return (x + torch.randn(2, 3, tokens, head_dim, generator=g)).to(dtype)


def tokens_for(codec, blocks: int = 1) -> int:
    """A sequence length the codec accepts: `blocks` whole blocks, at least 16 tokens."""
    bt = codec.block_tokens
    return bt * blocks * max(1, math.ceil(16 / bt))


# ---------------------------------------------------------------------------- round trip and bytes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", CODECS)
def test_round_trip_shape_and_dtype(name: str, dtype: torch.dtype) -> None:
    codec = CODECS[name]
    x = random_kv(tokens_for(codec), dtype)
    enc = codec.encode(x)
    y = codec.decode(enc)
    assert y.shape == x.shape, f"{name}: decoded shape {tuple(y.shape)} != {tuple(x.shape)}"
    assert y.dtype == x.dtype, f"{name}: decoded dtype {y.dtype} != {x.dtype}"
    assert enc.shape == tuple(x.shape) and enc.dtype == x.dtype
    assert torch.isfinite(y).all(), f"{name}: non-finite values after a round trip"


@pytest.mark.parametrize("name", CODECS)
def test_nbytes_counts_every_stored_tensor(name: str) -> None:
    codec = CODECS[name]
    x = random_kv(tokens_for(codec))
    enc = codec.encode(x)
    stored = sum(t.numel() * t.element_size() for t in enc.data.values())
    assert codec.nbytes(enc) == stored == enc.nbytes, f"{name}: nbytes is not the sum of stored tensor bytes"
    for key, t in enc.data.items():
        assert t.shape[:2] == x.shape[:2], f"{name}.{key}: leading dims {tuple(t.shape[:2])} are not (B, H)"


@pytest.mark.parametrize("name", CODECS)
def test_concatenation_rule(name: str) -> None:
    """encode(cat(a, b)) == cat(encode(a), encode(b)) along dim 2, and decode agrees."""
    codec = CODECS[name]
    a = random_kv(tokens_for(codec, 1), seed=1)
    b = random_kv(tokens_for(codec, 2), seed=2)
    whole = codec.encode(torch.cat([a, b], dim=2))
    parts = concat_encoded([codec.encode(a), codec.encode(b)])
    assert whole.shape == parts.shape and whole.data.keys() == parts.data.keys()
    for key in whole.data:
        assert torch.equal(whole.data[key], parts.data[key]), f"{name}.{key}: chunked archive differs"
    decoded = torch.cat([codec.decode(codec.encode(a)), codec.decode(codec.encode(b))], dim=2)
    torch.testing.assert_close(
        codec.decode(parts), decoded, rtol=0, atol=0, msg=lambda m: f"{name}: decode(concat) != concat(decode)\n{m}"
    )


@pytest.mark.parametrize("name", CODECS)
def test_deterministic(name: str) -> None:
    codec = CODECS[name]
    x = random_kv(tokens_for(codec))
    first, second = codec.encode(x), codec.encode(x.clone())
    for key in first.data:
        assert torch.equal(first.data[key], second.data[key]), f"{name}.{key}: encode is not deterministic"


@pytest.mark.parametrize("name", CODECS)
def test_rejects_partial_blocks(name: str) -> None:
    codec = CODECS[name]
    if codec.block_tokens == 1:
        pytest.skip("per-token codec: every length is whole")
    with pytest.raises(ValueError, match="block_tokens"):
        codec.encode(random_kv(codec.block_tokens + 1))


# ---------------------------------------------------------------------------- PNG: bitwise lossless

SPECIALS = [math.inf, -math.inf, math.nan, 0.0, -0.0]


def special_values(dtype: torch.dtype, seed: int) -> torch.Tensor:
    """(2, 3, 32, 16) of dtype: random normals of wild magnitudes, subnormals, inf, -inf, nan, +-0."""
    g = torch.Generator().manual_seed(seed)
    info = torch.finfo(dtype)
    x = torch.randn(2, 3, 32, 16, generator=g, dtype=torch.float64)
    exponents = torch.randint(-30, 30, x.shape, generator=g)
    x = (x * 2.0**exponents).to(dtype)
    flat = x.view(-1)
    picks = torch.randperm(flat.numel(), generator=g)[:200]
    values = SPECIALS + [info.tiny / 4, -info.tiny / 8, info.max, -info.max, info.smallest_normal]
    flat[picks] = torch.tensor(values, dtype=torch.float64)[torch.arange(200) % len(values)].to(dtype)
    # A nan with a non-default payload, written through the bit pattern.
    bits = flat.view(torch.int32 if dtype == torch.float32 else torch.int16)
    bits[0] = 0x7FC01234 if dtype == torch.float32 else 0x7E12
    return x


@pytest.mark.parametrize("block_size", [1, 3, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_delta_is_bitwise_lossless(dtype: torch.dtype, block_size: int) -> None:
    codec = Delta(block_size=block_size)
    x = special_values(dtype, seed=block_size)[:, :, : 30 // block_size * block_size]
    enc = codec.encode(x)
    y = codec.decode(enc)
    pattern = torch.int32 if dtype == torch.float32 else torch.int16
    assert y.dtype == dtype
    assert torch.equal(y.view(pattern), x.view(pattern)), "Delta changed a bit pattern"
    assert codec.nbytes(enc) == x.numel() * x.element_size(), "Delta bytes must equal native bytes"


@pytest.mark.parametrize("dtype", DTYPES[:2])
def test_delta_entropy_saves_on_smooth_signal(dtype: torch.dtype) -> None:
    codec = Delta(block_size=8)
    t = torch.linspace(0, 4, 256, dtype=torch.float64)
    channels = torch.arange(64, dtype=torch.float64)[:, None] / 64 + 1
    x = torch.sin(t[None, :] * channels).T.reshape(1, 1, 256, 64).to(dtype)  # (1, 1, S, D) smooth
    enc = codec.encode(x)
    assert codec.nbytes(enc) == x.numel() * x.element_size()
    assert codec.entropy_nbytes(enc) < codec.nbytes(enc), "zstd found nothing to save on a smooth signal"


def test_delta_rejects_other_dtypes() -> None:
    with pytest.raises(ValueError, match="allowed"):
        Delta().encode(torch.zeros(1, 1, 8, 4, dtype=torch.float64))


# ---------------------------------------------------------------------------- DCT

DCT_LOSSLESS = [  # (block_size, dtype, rtol): k == block_size keeps everything
    (1, torch.float32, 1e-6),
    (4, torch.float32, 1e-6),
    (8, torch.float32, 1e-6),
    (16, torch.float32, 1e-6),
    (8, torch.bfloat16, 2e-2),
]


@pytest.mark.parametrize("block_size, dtype, rtol", DCT_LOSSLESS)
def test_dct_full_band_is_lossless(block_size: int, dtype: torch.dtype, rtol: float) -> None:
    codec = DCT(block_size=block_size, k=block_size)
    x = random_kv(block_size * 4, dtype)
    y = codec.decode(codec.encode(x))
    rel = ((y.float() - x.float()).norm() / x.float().norm()).item()
    assert rel <= rtol, f"DCT r={block_size} k=r relative error {rel:.2e} > {rtol:.0e}"


@pytest.mark.parametrize("block_size", [1, 5, 8, 16])
def test_dct_basis_is_orthonormal(block_size: int) -> None:
    m = dct_basis(block_size, block_size).double()
    torch.testing.assert_close(
        m @ m.T, torch.eye(block_size, dtype=torch.float64), atol=1e-6, rtol=0, msg="DCT basis is not orthonormal"
    )
    assert torch.equal(DCT(block_size=block_size, k=1).basis(), dct_basis(block_size, 1))


def test_dct_layout_rows_are_block_major() -> None:
    """Row block*k + j holds frequency j of that block; the DC row is sqrt(r) * block mean."""
    codec = DCT(block_size=4, k=2)
    x = random_kv(12)
    coeffs = codec.encode(x).data["coeffs"]  # (B, H, 3*2, D)
    means = x.reshape(2, 3, 3, 4, 64).mean(3)  # (B, H, nb, D)
    torch.testing.assert_close(coeffs[:, :, 0::2], means * 2.0, msg="DC rows are not at block*k")


# ---------------------------------------------------------------------------- quantizers

PACK_SHAPES = [(1,), (3,), (2, 5), (1, 1, 7)]  # leading dims; rows are `units` whole pack units


@pytest.mark.parametrize("units", [1, 3])
@pytest.mark.parametrize("lead", PACK_SHAPES)
@pytest.mark.parametrize("bits", ALLOWED_BITS)
def test_bit_packing_round_trip(bits: int, lead: tuple[int, ...], units: int) -> None:
    n = units * 8  # 8 codes always fill whole bytes
    g = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 1 << bits, (*lead, n), generator=g)
    packed = pack_bits(codes, bits)
    assert packed.dtype == torch.uint8 and packed.shape == (*lead, n * bits // 8)
    assert torch.equal(unpack_bits(packed, bits), codes), f"{bits}-bit pack/unpack round trip failed"


PACK_ORDER = [  # (bits, codes, expected bytes): LSB-first bit stream
    (8, [1, 255], [1, 255]),
    (4, [0x1, 0xF], [0xF1]),
    (2, [1, 2, 3, 0], [0b00111001]),
    (3, [1, 2, 3, 4, 5, 6, 7, 0], [0b11010001, 0b01011000, 0b00011111]),
]


@pytest.mark.parametrize("bits, codes, expected", PACK_ORDER)
def test_bit_packing_order(bits: int, codes: list[int], expected: list[int]) -> None:
    packed = pack_bits(torch.tensor(codes), bits)
    assert packed.tolist() == expected, f"{bits}-bit packing order: {packed.tolist()} != {expected}"


@pytest.mark.parametrize("bits, length", [(2, 6), (3, 12), (4, 3)])
def test_bit_packing_rejects_partial_bytes(bits: int, length: int) -> None:
    with pytest.raises(ValueError, match="multiple of"):
        pack_bits(torch.zeros(length, dtype=torch.int64), bits)


def test_group_quant_is_exact_on_its_grid() -> None:
    """Values already on a 4-bit grid per group come back exactly (scale, zero exact in fp16)."""
    codes = torch.randint(0, 16, (1, 2, 4, 32), generator=torch.Generator().manual_seed(0))
    codes[..., 0], codes[..., 1] = 0, 15
    x = codes.float() * 0.25 - 1.0
    torch.testing.assert_close(GroupQuant(bits=4).decode(GroupQuant(bits=4).encode(x)), x, rtol=0, atol=0)


CONSTANT_GROUPS = [  # (codec, value): a zero-range group must not divide by zero
    (GroupQuant(bits=2), 3.5),
    (GroupQuant(bits=4, group=4, per_channel=True), -1.25),
    (LloydMaxQuant(bits=3), 0.0),
    (LloydMaxQuant(bits=4, group=4, per_channel=True), 0.0),
]


@pytest.mark.parametrize("codec, value", CONSTANT_GROUPS)
def test_constant_groups_are_exact(codec, value: float) -> None:
    x = torch.full((1, 1, 4, 32), value)
    torch.testing.assert_close(codec.decode(codec.encode(x)), x, rtol=0, atol=0, msg=f"{codec}: constant group")


def test_lloyd_max_codebook() -> None:
    """Ascending, symmetric, a fixed point of Lloyd's centroid condition; Max (1960) 2-bit levels."""
    for bits in ALLOWED_BITS:
        levels = codebook(bits).double()
        assert levels.shape == (1 << bits,) and (levels.diff() > 0).all()
        torch.testing.assert_close(levels, -levels.flip(0), msg=f"{bits}-bit codebook not symmetric")
    torch.testing.assert_close(codebook(2), torch.tensor([-1.5104, -0.4528, 0.4528, 1.5104]), atol=1e-4, rtol=0)
    g = torch.Generator().manual_seed(0)
    sample = torch.randn(400_000, generator=g, dtype=torch.float64)
    levels = codebook(3).double()
    cells = torch.bucketize(sample, (levels[1:] + levels[:-1]) / 2)
    centroids = torch.zeros(8, dtype=torch.float64).index_add_(0, cells, sample) / torch.bincount(cells)
    torch.testing.assert_close(centroids, levels, atol=2e-2, rtol=0, msg="levels are not cell centroids")


LLOYD_BEATS_MINMAX = [  # (bits, Lloyd-Max group, min/max group): equal bytes per value on rotated Gaussians
    (2, 32, 64),
    (3, 32, 64),
    (4, 32, 64),
]


@pytest.mark.parametrize("bits, lm_group, mm_group", LLOYD_BEATS_MINMAX)
def test_lloyd_max_beats_min_max_at_equal_bytes(bits: int, lm_group: int, mm_group: int) -> None:
    x = torch.randn(1, 4, 64, 64, generator=torch.Generator().manual_seed(bits))
    lm, mm = LloydMaxQuant(bits=bits, group=lm_group), GroupQuant(bits=bits, group=mm_group)
    enc_lm, enc_mm = lm.encode(x), mm.encode(x)
    assert lm.nbytes(enc_lm) == mm.nbytes(enc_mm)
    err_lm = (lm.decode(enc_lm) - x).norm()
    err_mm = (mm.decode(enc_mm) - x).norm()
    assert err_lm < err_mm, f"{bits}-bit Lloyd-Max error {err_lm:.4f} >= min/max {err_mm:.4f}"


# ---------------------------------------------------------------------------- rotation


@pytest.mark.parametrize("head_dim", [1, 2, 64, 128, 80, 96, 192])  # 80, 96, 192: blocks of 16, 32, 64 channels
@pytest.mark.parametrize("seed", [0, 3])
def test_rotation_is_orthonormal(head_dim: int, seed: int) -> None:
    rotation = Rotation(inner=DCT(block_size=1, k=1), seed=seed)  # an exact inner codec
    q = rotation.matrix(head_dim).double()
    torch.testing.assert_close(
        q @ q.T, torch.eye(head_dim, dtype=torch.float64), atol=1e-5, rtol=0, msg="rotation is not orthonormal"
    )
    x = random_kv(8, head_dim=head_dim)
    torch.testing.assert_close(
        rotation.decode(rotation.encode(x)), x, atol=1e-5, rtol=1e-5, msg="inverse rotation does not recover x"
    )


def test_rotation_spreads_an_outlier_over_its_block() -> None:
    """head_dim 80: a block-diagonal Hadamard of 16-channel blocks; a spike in one channel becomes 16 equal ones."""
    spike = torch.zeros(80)
    spike[37] = 4.0
    rotated = spike @ Rotation().matrix(80)
    assert (rotated.abs() > 0).sum() == 16 and torch.allclose(rotated.abs()[rotated != 0], torch.tensor(1.0))
    assert (rotated[32:48] != 0).all(), "the spike's own block of 16"


@pytest.mark.parametrize("codec, head_dim, group, unchanged", [
    (GroupQuant(bits=8, group=32), 80, 16, False), (GroupQuant(bits=8, group=32), 64, 32, True),
    (GroupQuant(bits=4, group=32, per_channel=True), 80, 32, True),  # per-channel groups span tokens
    (Rotation(inner=LloydMaxQuant(bits=4, group=32)), 48, 16, False),
    (DCT(k=8, coeffs=GroupQuant(bits=8, group=64)), 96, 32, False),
])
def test_codecs_fit_any_head_dim(codec, head_dim: int, group: int, unchanged: bool) -> None:
    fitted = for_head_dim(codec, head_dim)
    leaf = fitted
    while hasattr(leaf, "inner") or hasattr(leaf, "coeffs"):
        leaf = getattr(leaf, "inner", None) or leaf.coeffs
    assert leaf.group == group and (fitted is codec) == unchanged
    x = random_kv(32, head_dim=head_dim)
    got = fitted.decode(fitted.encode(x))
    assert got.shape == x.shape and (got - x).norm() / x.norm() < 0.1


def test_rotation_depends_only_on_seed() -> None:
    assert torch.equal(Rotation(seed=1).matrix(64), Rotation(inner=LloydMaxQuant(), seed=1).matrix(64))
    assert not torch.equal(Rotation(seed=1).matrix(64), Rotation(seed=2).matrix(64))


# ---------------------------------------------------------------------------- validation

INVALID = [  # (constructor, expected message fragment)
    (lambda: GroupQuant(bits=5), r"allowed: \(2, 3, 4, 8\)"),
    (lambda: GroupQuant(bits=1), r"allowed: \(2, 3, 4, 8\)"),
    (lambda: GroupQuant(group=0), "positive integer"),
    (lambda: GroupQuant(group=-4, per_channel=True), "positive integer"),
    (lambda: LloydMaxQuant(bits=6), r"allowed: \(2, 3, 4, 8\)"),
    (lambda: LloydMaxQuant(group=0), "positive integer"),
    (lambda: LloydMaxQuant(scales=()), "non-empty"),
    (lambda: LloydMaxQuant(scales=(1.0, -0.5)), "positive"),
    (lambda: LloydMaxQuant(refit=1), "True or False"),
    (lambda: DCT(block_size=8, k=9), r"allowed: \[1, 2, 3, 4, 5, 6, 7, 8\]"),
    (lambda: DCT(block_size=4, k=0), r"allowed: \[1, 2, 3, 4\]"),
    (lambda: DCT(block_size=0), "whole number in 1..64"),
    (lambda: DCT(coeffs="int8"), "not a codec"),
    (lambda: Cast("int4"), "allowed: bfloat16, float16, float32"),
    (lambda: Delta(block_size=0), "positive integer"),
    (lambda: Rotation(inner=None), "not a codec"),
    (lambda: Rotation(seed=-1), "non-negative"),
]


@pytest.mark.parametrize("make, message", INVALID)
def test_invalid_settings_raise(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


INVALID_INPUTS = [  # (codec, input shape, expected message fragment)
    (GroupQuant(bits=4, group=48), (1, 1, 4, 64), r"divide head_dim=64 \(allowed: \[1, 2, 4, 8, 16, 32, 64\]\)"),
    (GroupQuant(bits=3, group=4), (1, 1, 4, 12), "multiple of 8"),
    (LloydMaxQuant(bits=2, group=2), (1, 1, 4, 6), "multiple of 4"),
    (Rotation(), (1, 1, 4, 40), r"group=32 must divide head_dim=40"),  # a tier fits it first (codecs/fit.py)
    (GroupQuant(), (4, 64), r"\(B, H, S, D\)"),
]


@pytest.mark.parametrize("codec, shape, message", INVALID_INPUTS)
def test_invalid_inputs_raise(codec, shape: tuple[int, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        codec.encode(torch.zeros(shape))


def test_concat_encoded_needs_input() -> None:
    with pytest.raises(ValueError, match="at least one"):
        concat_encoded([])
    enc = Encoded({"t": torch.zeros(1, 1, 2, 3)}, (1, 1, 2, 3), torch.float32)
    assert concat_encoded([enc, enc]).shape == (1, 1, 4, 3)
