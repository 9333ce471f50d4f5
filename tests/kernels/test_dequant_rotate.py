"""dequant_rotate (Triton, interpreter on CPU) returns what Rotation / GroupQuant / LloydMaxQuant decode returns."""

import pytest
import torch

from codeckv.codecs import GroupQuant, LloydMaxQuant, Rotation
from codeckv.tiers import TIERS
from kernels import ops
from kernels.dequant_rotate import dequant_rotate_ref, dequant_rotate_supported, dequant_rotate_triton

LM2_PER_CHANNEL = LloydMaxQuant(bits=2, group=16, per_channel=True)
# (codec, (B, H, S, D)); S a multiple of block_tokens
CASES = {
    "turbo-4-value-one-row": (TIERS["turbo-4"].value, (1, 1, 1, 64)),
    "turbo-4-value-odd-length": (TIERS["turbo-4"].value, (2, 2, 37, 64)),
    "turbo-4-key-per-channel": (TIERS["turbo-4"].key, (1, 2, 64, 64)),
    "turbo-3-key-per-channel": (TIERS["turbo-3"].key, (1, 2, 32, 64)),
    "int8-d96": (TIERS["int8"].value, (1, 3, 19, 96)),
    "nvfp4-e4m3-scales": (TIERS["nvfp4"].value, (2, 2, 9, 64)),  # E2M1 codes, E4M3 scales read as bytes
    "mxfp4-e8m0-scales": (TIERS["mxfp4"].value, (1, 2, 7, 128)),
    "rotated-lloyd-max2-per-channel": (Rotation(inner=LM2_PER_CHANNEL), (1, 2, 32, 32)),
    "rotated-gq3-seed5": (Rotation(inner=GroupQuant(bits=3, group=32), seed=5), (1, 2, 9, 64)),
    "lloyd-max3-g8-d48": (LloydMaxQuant(bits=3, group=8), (1, 2, 11, 48)),
}


@pytest.mark.parametrize("codec, shape", CASES.values(), ids=CASES.keys())
def test_dequant_rotate_matches_the_codec(codec, shape, random_kv):
    enc = codec.encode(random_kv(shape))
    assert dequant_rotate_supported(enc, codec)
    got, want = dequant_rotate_triton(enc, codec), dequant_rotate_ref(enc, codec)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f"dequant_rotate differs from {codec}")


def test_public_op_uses_the_reference_on_cpu(random_kv):
    codec = TIERS["turbo-4"].value
    enc = codec.encode(random_kv((1, 2, 5, 64), device="cpu"))
    assert torch.equal(ops.dequant_rotate(enc, codec), codec.decode(enc))
