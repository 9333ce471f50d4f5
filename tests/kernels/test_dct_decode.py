"""dct_decode (Triton, interpreter on CPU) returns what DCT.decode returns."""

import pytest
import torch

from codeckv.codecs import DCT, GroupQuant, LloydMaxQuant, Rotation
from codeckv.tiers import TIERS
from kernels import ops
from kernels.dct_decode import dct_decode_ref, dct_decode_supported, dct_decode_triton

GQ3_PER_CHANNEL = GroupQuant(bits=3, group=32, per_channel=True)
# (codec, (B, H, blocks of block_tokens, D))
CASES = {
    "jpeg-k2-int8-one-block": (TIERS["jpeg-k2-int8"].value, (1, 1, 1, 64)),
    "jpeg-k8-int8": (TIERS["jpeg-k8-int8"].value, (2, 3, 3, 64)),
    "r4-k2-raw-fp32": (DCT(block_size=4, k=2), (1, 2, 3, 64)),
    "jpeg-k4-bf16-d48": (TIERS["jpeg-k4"].value, (1, 2, 5, 48)),
    "r6-k3-gq4-g16-d48": (DCT(block_size=6, k=3, coeffs=GroupQuant(bits=4, group=16)), (1, 2, 3, 48)),
    "r5-k2-gq3-per-channel": (DCT(block_size=5, k=2, coeffs=GQ3_PER_CHANNEL), (1, 2, 2, 32)),
    "r3-k3-lloyd-max2": (DCT(block_size=3, k=3, coeffs=LloydMaxQuant(bits=2, group=16)), (1, 2, 7, 32)),
    "r8-k4-rotated-lloyd-max4": (DCT(block_size=8, k=4, coeffs=Rotation(inner=LloydMaxQuant(bits=4))), (1, 2, 3, 64)),
}


@pytest.mark.parametrize("codec, shape", CASES.values(), ids=CASES.keys())
def test_dct_decode_matches_the_codec(codec, shape, random_kv):
    b, h, blocks, d = shape
    enc = codec.encode(random_kv((b, h, blocks * codec.block_tokens, d)))
    assert dct_decode_supported(enc, codec)
    got, want = dct_decode_triton(enc, codec), dct_decode_ref(enc, codec)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f"dct_decode differs from {codec}")


def test_public_op_uses_the_reference_on_cpu(random_kv):
    codec = TIERS["jpeg-k8-int8"].value
    enc = codec.encode(random_kv((1, 2, 16, 64), device="cpu"))
    assert torch.equal(ops.dct_decode(enc, codec), codec.decode(enc))
