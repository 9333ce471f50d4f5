"""dct_encode (Triton, interpreter on CPU) writes exactly the tensors DCT.encode stores."""

import pytest
import torch

from codeckv.codecs import DCT, GroupQuant, LloydMaxQuant, Rotation
from codeckv.tiers import TIERS
from kernels import ops
from kernels.dct_encode import dct_encode_ref, dct_encode_supported, dct_encode_triton

GQ3_PER_CHANNEL = GroupQuant(bits=3, group=32, per_channel=True)
# (codec, (B, H, blocks of block_tokens, D))
CASES = {
    "jpeg-k2-int8-one-block": (TIERS["jpeg-k2-int8"].key, (1, 1, 1, 64)),
    "jpeg-k8-int8": (TIERS["jpeg-k8-int8"].key, (2, 3, 3, 64)),
    "r4-k2-raw-fp32": (DCT(block_size=4, k=2), (1, 2, 3, 64)),
    "jpeg-k4-bf16-d48": (TIERS["jpeg-k4"].key, (1, 2, 5, 48)),
    "r6-k3-gq4-g16-d48": (DCT(block_size=6, k=3, coeffs=GroupQuant(bits=4, group=16)), (1, 2, 3, 48)),
    "r5-k2-gq3-per-channel": (DCT(block_size=5, k=2, coeffs=GQ3_PER_CHANNEL), (1, 2, 2, 32)),
    "r8-k2-lloyd-max4": (DCT(block_size=8, k=2, coeffs=LloydMaxQuant(bits=4, group=32)), (1, 2, 3, 64)),
    "r8-k4-rotated-gq4": (DCT(block_size=8, k=4, coeffs=Rotation(inner=GroupQuant(bits=4, group=32))), (1, 2, 3, 64)),
}


@pytest.mark.parametrize("codec, shape", CASES.values(), ids=CASES.keys())
def test_dct_encode_matches_the_codec(codec, shape, assert_same_storage, random_kv):
    b, h, blocks, d = shape
    x = random_kv((b, h, blocks * codec.block_tokens, d))
    assert dct_encode_supported(x, codec)
    assert_same_storage(dct_encode_triton(x, codec), dct_encode_ref(x, codec))


def test_public_op_uses_the_reference_on_cpu(random_kv):
    codec = TIERS["jpeg-k2-int8"].key
    x = random_kv((1, 2, 16, 64), device="cpu")
    assert ops.backend_name("cpu") == "torch"
    got, want = ops.dct_encode(x, codec), codec.encode(x)
    assert all(torch.equal(got.data[n], want.data[n]) for n in want.data)
