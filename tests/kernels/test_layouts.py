"""Every preset tier through the kernels: the row layouts codecs declare, read by kernels that import no codec.

Parametrized over TIERS: each codec that declares a row layout is encoded and decoded by the Triton kernel
its layout selects (the interpreter on CPU) and must store and return exactly what the codec does; a
codec without a layout says why, and that reason is what backend_name shows.
"""

import subprocess
from pathlib import Path

import pytest
import torch

from codeckv.codecs import DCT, FP4, FP8, Cast, Delta, GroupQuant, LloydMaxQuant, Rotation
from codeckv.codecs.layout import NoRowLayout, QuantRows, RawRows, RowLayout
from codeckv.codecs.vllm_tq_values import TQValues
from codeckv.tiers import TIERS
from kernels import ops
from kernels.dct_decode import dct_decode_supported, dct_decode_triton
from kernels.dct_encode import dct_encode_supported, dct_encode_triton
from kernels.dequant_rotate import dequant_rotate_supported, dequant_rotate_triton
from kernels.layout import layout_of
from kernels.rotate_quant import rotate_quant_supported, rotate_quant_triton

ROOT = Path(__file__).resolve().parents[2]
CODECS = {f"{name}.{side}": getattr(tier, side) for name, tier in TIERS.items() for side in ("key", "value")
          if getattr(tier, side) is not None}
DECLARED = {name: codec for name, codec in CODECS.items() if isinstance(layout_of(codec), RowLayout)}


def test_most_preset_codecs_declare_a_layout():
    """png stores deltas; fp8-e4m3-cal's rows need a scale per head, which no kernel multiplies by; vLLM's
    TurboQuant keys divide each row by its level vector's norm (norm correction), which no kernel computes."""
    vllm_keys = {f"vllm-tq-{preset}.key" for preset in ("4bit-nc", "k3v4-nc", "3bit-nc")}
    assert set(CODECS) - set(DECLARED) == {"png.key", "png.value", "fp8-e4m3-cal.key", "fp8-e4m3-cal.value",
                                           *vllm_keys}


@pytest.mark.parametrize("codec", DECLARED.values(), ids=DECLARED.keys())
def test_every_declared_layout_encodes_and_decodes_through_its_kernel(codec, random_kv, assert_same_storage):
    """Through the kernels its layout selects; the formats encode themselves (FP8: a cast; FP4: its E2M1 scale
    rule, which no quantizer kernel applies; vLLM's TurboQuant values: vLLM's rounding) and FP4 and TQValues decode
    through dequant_rotate, their scales read as bytes."""
    x = random_kv((1, 2, 2 * max(codec.block_tokens, 8), 64))
    want = codec.encode(x)
    if dct_encode_supported(x, codec):
        got, decoded = dct_encode_triton(x, codec), dct_decode_triton(want, codec)
        assert dct_decode_supported(want, codec)
    elif rotate_quant_supported(x, codec):
        assert dequant_rotate_supported(want, codec)
        got, decoded = rotate_quant_triton(x, codec), dequant_rotate_triton(want, codec)
    else:
        layout = layout_of(codec)
        assert isinstance(codec, FP8 | FP4 | TQValues), f"{codec!r}: only the formats encode themselves"
        assert ops.backend_name("cuda", codec) == "triton", "every op but the encoder is a kernel's"
        got = want
        decoded = dequant_rotate_triton(want, codec) if layout.quant is not None else codec.decode(want)
    assert_same_storage(got, want)
    torch.testing.assert_close(decoded, codec.decode(want), atol=1e-5, rtol=1e-5)


def test_layouts_compose_as_the_codecs_wrap():
    rotated_dct = DCT(block_size=8, k=2, coeffs=Rotation(inner=LloydMaxQuant(bits=3, group=32)))
    layout = rotated_dct.row_layout()
    assert (layout.block, layout.k, layout.prefix) == (8, 2, "coeffs.")
    assert isinstance(layout.rotation, Rotation) and layout.quant.lloyd_max and layout.quant.offset is None
    assert layout.name(layout.quant.codes) == "coeffs.codes" and set(rotated_dct.encode(
        torch.randn(1, 1, 64, 64)).data) == {"coeffs.codes", "coeffs.scale"}
    assert GroupQuant(bits=4).row_layout().rows == QuantRows(4, 32, False, offset="zero")
    assert DCT(k=4, coeffs=Cast("bfloat16")).row_layout().rows == RawRows("values", torch.bfloat16)
    assert DCT(k=4).row_layout().rows == RawRows("coeffs")
    nested = Rotation(inner=Rotation(inner=GroupQuant(bits=4)))
    assert "two rotations" in nested.row_layout().reason


def test_a_codec_without_a_layout_says_why_and_the_backend_shows_it():
    layout = Delta().row_layout()
    assert isinstance(layout, NoRowLayout) and "deltas" in layout.reason
    assert ops.backend_name("cuda", Delta()) == f"torch ({layout.reason})"
    assert ops.backend_name("cuda", TIERS["turbo-4"].value) == "triton"
    assert ops.backend_name("cpu", TIERS["turbo-4"].value) == "torch"


def test_public_encode_and_decode_use_the_codec_on_cpu(random_kv):
    for codec in (TIERS["turbo-4"].value, TIERS["jpeg-k2-int8"].key, TIERS["png"].key):
        x = random_kv((1, 2, 16, 64), device="cpu")
        want = codec.encode(x)
        got = ops.encode(x, codec)
        assert all(torch.equal(got.data[n], want.data[n]) for n in want.data)
        assert torch.equal(ops.decode(want, codec), codec.decode(want))


def test_the_kernels_import_no_codec_class():
    result = subprocess.run(["grep", "-rn", "from codeckv", "kernels/"], cwd=ROOT, capture_output=True, text=True)
    imports = [line for line in result.stdout.splitlines() if "from codeckv.codecs.layout import" not in line
               and "from codeckv.tiers import" not in line]
    assert imports == [], imports
