"""Store a tensor in a narrower float dtype (e.g. DCT coefficients in bf16).

The simplest lossy codec: `Cast("bfloat16")` keeps every value, rounded to the
storage dtype. It lets the seed's unquantized DCT tiers store their coefficients in
bf16 whatever the model's dtype, so their ratios mean the same on CPU (fp32) and GPU.

Storage (`Encoded.data`):

    values  (B, H, S, D)  dtype
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codeckv.codecs.base import Encoded, check_input
from codeckv.codecs.layout import RawRows, RowLayout

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class Cast:
    """Round every value to `dtype` (one of DTYPES)."""

    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"Cast: dtype={self.dtype!r} is not supported (allowed: {', '.join(DTYPES)})")

    @property
    def block_tokens(self) -> int:
        return 1

    def encode(self, x: torch.Tensor) -> Encoded:
        check_input(x, 1, "Cast")
        return Encoded({"values": x.to(DTYPES[self.dtype])}, tuple(x.shape), x.dtype)

    def decode(self, enc: Encoded) -> torch.Tensor:
        return enc.data["values"].to(enc.dtype)

    def nbytes(self, enc: Encoded) -> int:
        return enc.nbytes

    def row_layout(self) -> RowLayout:
        """Raw rows under "values", in the storage dtype."""
        return RowLayout(RawRows("values", DTYPES[self.dtype]))
