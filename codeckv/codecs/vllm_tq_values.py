"""vLLM's TurboQuant values: each value vector on a uniform grid between its own min and max, fp16 scale and zero.

    TQValues(bits=4)                         # the values of turboquant_k8v4, _4bit_nc, _k3v4_nc
    TQValues(bits=3)                         # the values of turboquant_3bit_nc

What vLLM 0.34.0 stores and reads back (reference: vllm/v1/attention/ops/triton_turboquant_store.py,
`_store_quantized_value`; triton_turboquant_decode.py, `_tq_decode_stage1` and `_tq_full_dequant_kv`), per token
and head, in float32:

    lo, hi = min(v), max(v);  scale = max((hi - lo) / (2**bits - 1), 1e-8)
    code = clamp(floor((v - lo) / scale + 0.5), 0, 2**bits - 1)        from the float32 scale and lo
    stored: codes, fp16(scale), fp16(lo);   decode: code * fp16(scale) + fp16(lo)

One group is the whole vector (head_dim channels), so the codec carries head_dim, which the cache sets to the
model's (codecs/fit.py). This differs from GroupQuant(bits, group=head_dim) only in how a code is chosen (GroupQuant
rounds half to even on the fp16-rounded grid): it stores the same tensors and decodes them the same way, so the
kernels read them as GroupQuant's rows; the codes are always written here, vLLM's way (QuantRows.codec_encodes).

Storage (`Encoded.data`), ceil(D * bits / 8) + 4 bytes a token and head, vLLM's value_packed_size:

    codes  (B, H, S, D*bits/8)  uint8    codes, packed LSB-first (codecs/bitpack.py: vLLM's packing too)
    scale  (B, H, S, 1)         float16
    zero   (B, H, S, 1)         float16  the vector's minimum
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codeckv.codecs.base import Encoded, check_input
from codeckv.codecs.bitpack import pack_bits, pack_unit
from codeckv.codecs.layout import QuantRows, RowLayout
from codeckv.codecs.quant import GroupQuant

VALUE_BITS = (3, 4)  # vLLM's presets store values at 3 or 4 bits


@dataclass(frozen=True)
class TQValues:
    """vLLM's TurboQuant value vectors: a uniform grid per vector, fp16 scale and zero (module docstring)."""

    bits: int = 4
    head_dim: int = 64  # one group a vector: the model's head_dim (the cache fits it: codecs/fit.py)

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or self.bits not in VALUE_BITS:
            raise ValueError(f"TQValues: bits={self.bits!r} is not supported (allowed: {VALUE_BITS})")
        if isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int) or self.head_dim < 1 \
                or self.head_dim % max(4, pack_unit(self.bits)[0]):
            raise ValueError(f"TQValues: head_dim={self.head_dim!r} must be a positive multiple of "
                             f"{max(4, pack_unit(self.bits)[0])} at {self.bits} bits (whole bytes, and an even slot "
                             "beside any key, as vLLM pads none)")

    @property
    def block_tokens(self) -> int:
        return 1

    @property
    def _grid(self) -> GroupQuant:
        """The same stored rows read as GroupQuant's: one group of head_dim channels."""
        return GroupQuant(bits=self.bits, group=self.head_dim)

    def _check(self, x: torch.Tensor) -> None:
        check_input(x, 1, "TQValues")
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"TQValues: head_dim={self.head_dim} but the values have {x.shape[-1]} channels "
                             "(fit the codec with codeckv.codecs.fit.for_head_dim)")

    def encode(self, x: torch.Tensor) -> Encoded:
        """Code each value vector of x (B, H, S, D) as vLLM's store kernel does."""
        self._check(x)
        v = x.float()
        lo, hi = v.amin(-1, keepdim=True), v.amax(-1, keepdim=True)  # (B, H, S, 1)
        top = (1 << self.bits) - 1
        scale = ((hi - lo) / top).clamp_min(1e-8)
        codes = ((v - lo) / scale + 0.5).floor().clamp_(0, top)  # (B, H, S, D)
        data = {"codes": pack_bits(codes, self.bits), "scale": scale.half(), "zero": lo.half()}
        return Encoded(data, tuple(x.shape), x.dtype)

    def decode(self, enc: Encoded) -> torch.Tensor:
        """code * scale + zero, in the original dtype: (B, H, S, D)."""
        return self._grid.decode(enc)

    def nbytes(self, enc: Encoded) -> int:
        """Codes, scales and zeros: vLLM's value_packed_size a token and head."""
        return enc.nbytes

    def row_layout(self) -> RowLayout:
        """GroupQuant's rows (code * scale + zero, one group a row), written by this codec only."""
        spec = QuantRows(self.bits, self.head_dim, per_channel=False, offset="zero", codec_encodes=True)
        return RowLayout(spec, leaf=self)
