"""Per op and per tier, which kernel path runs and why: the decision the ops take, and the model panel's table."""

import pytest

from codeckv.cache.kernel_ops import ans_status, op_backends
from codeckv.codecs import GroupQuant, Rotation
from codeckv.serve.backends import tier_backends
from codeckv.tiers import TIERS
from kernels.codes_cpu import FLAGS, build

PNG_REASON = TIERS["png"].key.row_layout().reason


@pytest.mark.parametrize("tier, device, expected", [
    ("turbo-4", "cuda", {"encode K": "triton rotate_quant", "decode K": "triton dequant_rotate",
                         "encode V": "triton rotate_quant", "decode V": "triton dequant_rotate"}),
    ("jpeg-k8-int8", "cuda", {"encode K": "triton dct_encode", "decode V": "triton dct_decode"}),
    ("png", "cuda", {"encode K": f"torch ({PNG_REASON})", "decode V": f"torch ({PNG_REASON})"}),
    ("turbo-4", "cpu", {"encode K": "torch (no CUDA device)", "decode V": "torch (no CUDA device)"}),
])
def test_each_op_says_its_path(tier, device, expected):
    paths = op_backends(TIERS[tier].key, TIERS[tier].value, device, head_dim=64)
    assert set(paths) == {"encode K", "decode K", "encode V", "decode V", "attention"}
    for op, path in expected.items():
        assert paths[op] == path, (tier, device, op)


def test_cpu_attention_says_what_the_compiled_kernel_does():
    built, status = build(FLAGS)
    paths = {name: op_backends(TIERS[name].key, TIERS[name].value, "cpu", 64)["attention"]
             for name in ("turbo-4", "int8", "jpeg-k8-int8")}
    if built is None:
        assert set(paths.values()) == {
            f"torch decode_attention_torch (no CUDA device; float rows a piece at a time: {status})"}
        return
    for name in ("turbo-4", "int8"):
        assert paths[name] == ("torch decode_attention_torch (no CUDA device; keys and values read on their codes "
                               f"by codes_cpu, {status})"), name
    assert paths["jpeg-k8-int8"] == (
        "torch decode_attention_torch (no CUDA device; float rows a piece at a time (keys: the compiled kernel reads "
        "no DCT coefficients; values: the compiled kernel reads no DCT coefficients))")


def test_attention_path_and_reason_per_tier():
    assert op_backends(TIERS["turbo-4"].key, TIERS["turbo-4"].value, "cuda", 64)["attention"].startswith(
        "triton decode_attention")
    png = op_backends(TIERS["png"].key, TIERS["png"].value, "cpu", 64)["attention"]
    assert png == f"torch reference, decodes first ({PNG_REASON})"


def test_a_layout_the_kernels_cannot_take_gives_the_kernels_reason():
    codec = Rotation(inner=GroupQuant(bits=4, group=8))  # a valid codec at head_dim 8, too narrow for the kernels
    paths = op_backends(codec, codec, "cuda", head_dim=8)
    assert paths["encode K"] == "torch (the rotation needs head_dim a power of two >= 16, not 8)"
    assert paths["decode V"] == paths["encode K"]


def test_a_shape_the_codec_refuses_is_said_for_every_op():
    paths = op_backends(TIERS["turbo-3"].key, TIERS["turbo-3"].value, "cuda", head_dim=12)
    assert all(p.startswith("none (GroupQuant: head_dim=12 at bits=3 does not pack") for p in paths.values())


def test_a_head_dim_the_presets_do_not_divide_is_fitted_first():
    """head_dim 48: turbo-4's value groups shrink to 16 (codecs/fit.py); the rotation's kernel wants a power of two."""
    table = tier_backends("cuda", 48, "bfloat16")
    assert table["turbo-4"]["encode"] == ("K: triton rotate_quant · V: torch (the rotation needs head_dim a power of "
                                          "two >= 16, not 48)")


def test_tier_table_covers_every_codec_tier():
    table = tier_backends("cuda", 64, "bfloat16")
    assert list(table) == [name for name, tier in TIERS.items() if not tier.is_native]
    coder = "ans_cpu, compiled C" if ans_status().startswith("compiled") else "numpy, reference ("
    assert f"+ ANS ({coder}" in table["pca-8x"]["encode"] and table["pca-8x"]["attention"].startswith("refused")
    assert table["turbo-4"]["encode"] == "triton rotate_quant"
