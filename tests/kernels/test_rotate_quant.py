"""rotate_quant (Triton, interpreter on CPU) writes exactly the tensors Rotation / GroupQuant / LloydMaxQuant store."""

import pytest
import torch

from codeckv.codecs import GroupQuant, LloydMaxQuant, Rotation
from codeckv.tiers import TIERS
from kernels import ops
from kernels.rotate_quant import rotate_quant_ref, rotate_quant_supported, rotate_quant_triton

LM2_PER_CHANNEL = LloydMaxQuant(bits=2, group=16, per_channel=True)
# (codec, (B, H, S, D)); S a multiple of block_tokens
CASES = {
    "turbo-4-value-one-row": (TIERS["turbo-4"].value, (1, 1, 1, 64)),
    "turbo-4-value-odd-length": (TIERS["turbo-4"].value, (2, 2, 37, 64)),
    "turbo-4-key-per-channel": (TIERS["turbo-4"].key, (1, 2, 64, 64)),
    "turbo-3-key-per-channel": (TIERS["turbo-3"].key, (1, 2, 32, 64)),
    "int8-d96": (TIERS["int8"].value, (1, 3, 19, 96)),
    "rotated-lloyd-max2-per-channel": (Rotation(inner=LM2_PER_CHANNEL), (1, 2, 32, 32)),
    "rotated-gq3-seed5": (Rotation(inner=GroupQuant(bits=3, group=32), seed=5), (1, 2, 9, 64)),
    "lloyd-max3-g8-d48": (LloydMaxQuant(bits=3, group=8), (1, 2, 11, 48)),
}


@pytest.mark.parametrize("codec, shape", CASES.values(), ids=CASES.keys())
def test_rotate_quant_matches_the_codec(codec, shape, assert_same_storage, random_kv):
    x = random_kv(shape)
    assert rotate_quant_supported(x, codec)
    assert_same_storage(rotate_quant_triton(x, codec), rotate_quant_ref(x, codec))


def test_public_op_uses_the_reference_on_cpu(random_kv):
    codec = TIERS["turbo-4"].value
    x = random_kv((1, 2, 5, 64), device="cpu")
    got, want = ops.rotate_quant(x, codec), codec.encode(x)
    assert all(torch.equal(got.data[n], want.data[n]) for n in want.data)
