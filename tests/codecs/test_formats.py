"""The engines' KV formats as codecs: FP8 (E4M3, E5M2; static scales) and FP4 microscaling (MXFP4, NVFP4)."""

import pytest
import torch

from codeckv.codecs.fp4 import FP4, LEVELS
from codeckv.codecs.fp8 import CALIBRATED, FP8
from codeckv.tiers import TIERS


def test_fp8_saturates_at_the_format_s_largest_value_and_keeps_one_byte_a_value():
    x = torch.tensor([0.0, 1.0, -3.3, 500.0, -1e5, 6e4]).view(1, 1, 1, 6)
    for fmt, largest in (("e4m3", 448.0), ("e5m2", 57344.0)):
        enc = FP8(fmt).encode(x)
        got = FP8(fmt).decode(enc).flatten()
        assert got.abs().max() == largest and torch.isfinite(got).all(), f"{fmt}: saturates, as vLLM converts"
        assert enc.nbytes == x.numel() and got[1] == 1.0


def test_fp8_scales_per_head_divide_and_multiply_back():
    x = torch.randn(2, 3, 8, 16) * torch.tensor([1.0, 100.0, 1000.0]).view(1, 3, 1, 1)
    scaled = FP8("e4m3", scale=(0.01, 0.5, 10.0))
    plain = FP8("e4m3")
    err = [(c.decode(c.encode(x)) - x)[:, 2].norm() / x[:, 2].norm() for c in (scaled, plain)]
    assert err[0] < 0.05 < err[1], "head 2 (up to ~4000) saturates at 448 without its scale"
    with pytest.raises(ValueError, match="2 scales for 3 KV heads"):
        FP8("e4m3", scale=(1.0, 2.0)).encode(x)


def test_a_calibrated_scale_says_where_it_comes_from():
    with pytest.raises(ValueError, match="make_cache\\(loaded"):
        FP8("e4m3", scale=CALIBRATED).encode(torch.zeros(1, 1, 1, 8))
    assert "no kernel multiplies" in FP8("e4m3", scale=CALIBRATED).row_layout().reason
    for bad in (0.0, -1.0, "per-head", (1.0, 0.0)):
        with pytest.raises(ValueError, match="FP8: scale="):
            FP8("e4m3", scale=bad)
    with pytest.raises(ValueError, match="allowed: e4m3, e5m2"):
        FP8("e3m4")


@pytest.mark.parametrize("codec, block", [(FP4(32, "e8m0"), 32), (FP4(16, "e4m3"), 16)])
def test_fp4_values_on_the_e2m1_grid_are_exact(codec, block):
    """A block holding only E2M1 values times a power of two (which both scale formats represent) comes back exactly."""
    levels = torch.tensor(LEVELS)
    x = levels[torch.randint(0, 16, (1, 2, 4, 64), generator=torch.Generator().manual_seed(0))] * 0.25
    x[..., ::block] = 1.5  # every block's amax 1.5: MXFP4's scale 2^(0 - 2) = 0.25, NVFP4's 1.5 / 6 = 0.25
    torch.testing.assert_close(codec.decode(codec.encode(x)), x, rtol=0, atol=0)


def test_fp4_scales_are_the_formats_own():
    x = torch.randn(1, 1, 3, 64, generator=torch.Generator().manual_seed(1)) * 5
    mx, nv = FP4(32, "e8m0").encode(x), FP4(16, "e4m3").encode(x)
    assert mx.data["scale"].dtype == torch.float8_e8m0fnu and nv.data["scale"].dtype == torch.float8_e4m3fn
    exponents = torch.log2(mx.data["scale"].float())
    assert torch.equal(exponents, exponents.round()), "MXFP4: a power of two per block"
    assert mx.data["scale"].shape == (1, 1, 3, 2) and nv.data["scale"].shape == (1, 1, 3, 4)
    assert mx.nbytes == 3 * (32 + 2) and nv.nbytes == 3 * (32 + 4), "4 bits a value and one byte a block"
    with pytest.raises(ValueError, match="allowed: \\(16, 32\\)"):
        FP4(block=8)


def test_the_format_tiers_say_which_engine_keeps_kv_that_way():
    for name, engine in (("fp8-e4m3", "vLLM"), ("fp8-e5m2", "vLLM"), ("nvfp4", "TensorRT-LLM"), ("mxfp4", "OCP"),
                         ("fp8-e4m3-cal", "llm-compressor")):
        assert engine in TIERS[name].description
