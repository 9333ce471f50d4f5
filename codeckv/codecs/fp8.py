"""FP8: each value an 8-bit float, as inference engines keep their KV caches (vLLM's and SGLang's kv_cache_dtype).

    FP8("e4m3")            # float8_e4m3fn: 4 exponent, 3 mantissa bits, at most 448; vLLM's default "fp8"
    FP8("e5m2")            # float8_e5m2: 5 exponent, 2 mantissa bits, at most 57344; vLLM's "fp8_e5m2"
    FP8("e4m3", scale=(0.2, 0.5))  # a static scale per KV head (llm-compressor's calibrated k_scale / v_scale)
    FP8("e4m3", scale="calibrated")  # those per head and layer, from the model: make_cache(loaded, ...) sets them

A value is divided by the static scale and cast, saturating at the format's largest value (vLLM converts with
saturation); decode multiplies back. The scale is part of the codec, not of what it stores: vLLM keeps k_scale and
v_scale per layer beside the weights, 1.0 when the checkpoint brings none, which is the default here too.

Storage (`Encoded.data`):

    values  (B, H, S, D)  float8_e4m3fn or float8_e5m2: one byte per value, nothing else
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codeckv.codecs.base import Encoded, check_input
from codeckv.codecs.layout import NoRowLayout, RawRows, RowLayout

FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
CALIBRATED = "calibrated"  # the scale a tier leaves to the model's calibration (codeckv/cache/kv_scales.py)


@dataclass(frozen=True)
class FP8:
    """x / scale cast to an 8-bit float of format `fmt` (module docstring)."""

    fmt: str = "e4m3"
    scale: float | tuple[float, ...] | str = 1.0  # static: one for every head, one per KV head, or CALIBRATED

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(f"FP8: fmt={self.fmt!r} is not supported (allowed: {', '.join(FORMATS)})")
        if self.scale == CALIBRATED:
            return
        scales = self.scale if isinstance(self.scale, tuple) else (self.scale,)
        if not scales or not all(isinstance(s, float | int) and not isinstance(s, bool) and s > 0 for s in scales):
            raise ValueError(f"FP8: scale={self.scale!r} must be a positive number, a tuple of them (one per head) "
                             f"or {CALIBRATED!r}")

    @property
    def block_tokens(self) -> int:
        return 1

    @property
    def largest(self) -> float:
        """The format's largest finite value: where encoding saturates."""
        return torch.finfo(FORMATS[self.fmt]).max

    def _scales(self, x: torch.Tensor) -> torch.Tensor | float:
        """The scale as a number, or (1, H, 1, 1) per head for x (B, H, S, D)."""
        if self.scale == CALIBRATED:
            raise ValueError("FP8: scale='calibrated' is set from the model's calibration: build the cache with "
                             "make_cache(loaded, ...) (codeckv/cache/kv_scales.py)")
        if not isinstance(self.scale, tuple):
            return float(self.scale)
        if len(self.scale) != x.shape[1]:
            raise ValueError(f"FP8: {len(self.scale)} scales for {x.shape[1]} KV heads (allowed: one per head)")
        return torch.tensor(self.scale, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)

    def encode(self, x: torch.Tensor) -> Encoded:
        check_input(x, 1, "FP8")
        y = (x.float() / self._scales(x)).clamp(-self.largest, self.largest)
        return Encoded({"values": y.to(FORMATS[self.fmt])}, tuple(x.shape), x.dtype)

    def decode(self, enc: Encoded) -> torch.Tensor:
        values = enc.data["values"]
        return (values.float() * self._scales(values)).to(enc.dtype)

    def nbytes(self, enc: Encoded) -> int:
        return enc.nbytes

    def row_layout(self) -> RowLayout | NoRowLayout:
        """Raw rows in the float8 dtype where the scale is 1 (the rows are the values); else none."""
        if self.scale != 1.0:
            return NoRowLayout("fp8 values under a static scale: no kernel multiplies raw rows by a scale")
        return RowLayout(RawRows("values", FORMATS[self.fmt]))
