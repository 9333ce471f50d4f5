"""KV codecs: each a small dataclass with encode / decode / nbytes over (B, H, S, D) tensors."""

from codeckv.codecs.base import Codec, Encoded, check_input, concat_encoded
from codeckv.codecs.bitpack import ALLOWED_BITS, pack_bits, unpack_bits
from codeckv.codecs.cast import Cast
from codeckv.codecs.dct import DCT, dct_basis
from codeckv.codecs.delta import Delta
from codeckv.codecs.fp4 import FP4
from codeckv.codecs.fp8 import FP8
from codeckv.codecs.lloyd_max import LloydMaxQuant, codebook
from codeckv.codecs.quant import GroupQuant
from codeckv.codecs.rotation import Rotation

__all__ = [
    "ALLOWED_BITS",
    "Cast",
    "DCT",
    "Codec",
    "Delta",
    "Encoded",
    "FP4",
    "FP8",
    "GroupQuant",
    "LloydMaxQuant",
    "Rotation",
    "check_input",
    "codebook",
    "concat_encoded",
    "dct_basis",
    "pack_bits",
    "unpack_bits",
]
