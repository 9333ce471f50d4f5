"""vLLM's TurboQuant keys: each key vector's norm in fp16, its direction rotated and coded per coordinate.

    TQKeys(bits=3)                           # turboquant_k3v4_nc / turboquant_3bit_nc keys (norm correction on)
    TQKeys(bits=4)                           # turboquant_4bit_nc keys

What vLLM 0.34.0 stores and reads back, from its own source (reference: vllm/v1/attention/ops/
triton_turboquant_store.py, `triton_turboquant_store` and `_tq_fused_store_mse`; triton_turboquant_decode.py,
`_tq_decode_stage1` and `_tq_full_dequant_kv`; the matrix and levels from vllm/v1/attention/backends/
turboquant_attn.py, `_build_hadamard` and `TurboQuantAttentionImpl._ensure_on_device`):

    n = ||k||  (float32)                     stored as float16
    y = (k / (n + 1e-8)) @ H                 H = Sylvester's Hadamard / sqrt(D), no random signs (H = H^T)
    code[j] = #{midpoints <= y[j]}           midpoints of the Lloyd-Max levels c for N(0, 1/D) at `bits` bits
    decode: c = levels[code]; with norm correction c = c / sqrt(sum(c^2) + 1e-16); k = (n16 * c) @ H

The levels are vLLM's own recipe (centroids.py, `solve_lloyd_max`): Lloyd iteration from 2**bits levels spread
evenly over +-3.5 sigma, each interval's mean by the trapezoid rule on 200 steps, the outer intervals reaching to
+-10.5 sigma, at most 200 rounds or until no level moves by 1e-10. They are not the exact Gaussian levels of
codecs/lloyd_max.py: with 200 rounds the 4-bit levels have not converged, and vLLM decodes with these.

vLLM's config names the rotation Hadamard and its quantizer.py offers a seeded QR rotation; the kernels are given
the plain Sylvester matrix, which this codec applies (a power-of-two head_dim, as vLLM's construction needs).

Storage (`Encoded.data`), ceil(D * bits / 8) + 2 bytes a token and head, vLLM's key_packed_size:

    codes  (B, H, S, D*bits/8)  uint8    level indices, packed LSB-first (codecs/bitpack.py: vLLM's packing too)
    norm   (B, H, S, 1)         float16  ||k||
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from codeckv.codecs.base import Encoded, check_input
from codeckv.codecs.bitpack import pack_bits, unpack_bits
from codeckv.codecs.layout import NoRowLayout
from codeckv.codecs.rotation import sylvester

KEY_BITS = (3, 4)  # vLLM's presets code keys at 3 or 4 bits (8 is FP8: codecs/fp8.py)
_SPREAD, _REACH, _STEPS, _ROUNDS, _TOLERANCE = 3.5, 3.0, 200, 200, 1e-10  # vLLM's solve_lloyd_max constants


def _trapezoid(f, a: float, b: float) -> float:
    """The trapezoid rule for f on [a, b] in _STEPS steps."""
    h = (b - a) / _STEPS
    return (0.5 * (f(a) + f(b)) + sum(f(a + i * h) for i in range(1, _STEPS))) * h


CPU = torch.device("cpu")  # where the tables are made first


@functools.cache
def levels(head_dim: int, bits: int, device: torch.device = CPU) -> torch.Tensor:
    """vLLM's Lloyd-Max levels for N(0, 1/head_dim) at `bits` bits: (2**bits,) float32, ascending (docstring); one
    copy per device, so no step copies them host -> device."""
    if device.type != "cpu":
        return levels(head_dim, bits).to(device)
    count, sigma2 = 2**bits, 1.0 / head_dim
    lo, hi = -_SPREAD * math.sqrt(sigma2), _SPREAD * math.sqrt(sigma2)

    def pdf(x: float) -> float:
        return math.exp(-x * x / (2 * sigma2)) / math.sqrt(2 * math.pi * sigma2)

    level = [lo + (hi - lo) * (i + 0.5) / count for i in range(count)]
    for _ in range(_ROUNDS):
        edges = [lo * _REACH, *((a + b) / 2 for a, b in zip(level, level[1:])), hi * _REACH]
        moved = []
        for i in range(count):
            mass = _trapezoid(pdf, edges[i], edges[i + 1])
            moved.append(_trapezoid(lambda x: x * pdf(x), edges[i], edges[i + 1]) / mass if mass > 1e-15
                         else level[i])
        if max(abs(new - old) for new, old in zip(moved, level)) < _TOLERANCE:
            break
        level = moved
    return torch.tensor(level, dtype=torch.float32)


@functools.cache
def midpoints(head_dim: int, bits: int, device: torch.device = CPU) -> torch.Tensor:
    """The decision thresholds vLLM bucketizes with: neighbouring float32 levels' means, (2**bits - 1,) float32."""
    c = levels(head_dim, bits, device)
    return (c[:-1] + c[1:]) / 2


@functools.cache
def hadamard(head_dim: int, device: torch.device = CPU) -> torch.Tensor:
    """H = Sylvester(D) / sqrt(D), (D, D) float32, one copy per device: orthonormal and symmetric, vLLM's rotation."""
    return (sylvester(head_dim) / math.sqrt(head_dim)).to(device)


def check_head_dim(head_dim: int, name: str) -> None:
    """Raise ValueError unless head_dim is a power of two >= 16 (Sylvester's construction; an even slot)."""
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"{name}: head_dim={head_dim} is not a power of two >= 16, which vLLM's Hadamard rotation "
                         "needs (allowed: 16, 32, 64, 128, 256, ...)")


@dataclass(frozen=True)
class TQKeys:
    """vLLM's TurboQuant key vectors: fp16 norm + rotated Lloyd-Max codes (module docstring)."""

    bits: int = 3
    norm_correction: bool = True  # rescale the level vector to unit norm before the inverse rotation

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or self.bits not in KEY_BITS:
            raise ValueError(f"TQKeys: bits={self.bits!r} is not supported (allowed: {KEY_BITS}; 8-bit keys are "
                             "FP8('e4m3'))")
        if not isinstance(self.norm_correction, bool):
            raise ValueError(f"TQKeys: norm_correction={self.norm_correction!r} must be True or False")

    @property
    def block_tokens(self) -> int:
        return 1

    def encode(self, x: torch.Tensor) -> Encoded:
        """Code each key vector of x (B, H, S, D) as vLLM's store kernel does."""
        check_input(x, 1, "TQKeys")
        d = x.shape[-1]
        check_head_dim(d, "TQKeys")
        k = x.float()
        norm = k.norm(dim=-1, keepdim=True)  # (B, H, S, 1)
        y = (k / (norm + 1e-8)) @ hadamard(d, x.device)  # (B, H, S, D)
        codes = torch.bucketize(y, midpoints(d, self.bits, x.device), right=True)  # y >= midpoint: above it
        return Encoded({"codes": pack_bits(codes, self.bits), "norm": norm.half()}, tuple(x.shape), x.dtype)

    def decode(self, enc: Encoded) -> torch.Tensor:
        """Levels times the stored norm (the level vector first brought to unit norm), rotated back: (B, H, S, D)."""
        codes = enc.data["codes"]
        d = enc.shape[-1]
        c = levels(d, self.bits, codes.device)[unpack_bits(codes, self.bits)]  # (B, H, S, D)
        if self.norm_correction:
            c = c / torch.sqrt((c * c).sum(-1, keepdim=True) + 1e-16)
        k = (enc.data["norm"].float() * c) @ hadamard(d, codes.device)
        return k.to(enc.dtype)

    def nbytes(self, enc: Encoded) -> int:
        """Codes and norms: vLLM's key_packed_size a token and head."""
        return enc.nbytes

    def row_layout(self) -> NoRowLayout:
        """None: the norm correction divides each row by its level vector's norm, which no kernel here computes."""
        return NoRowLayout("vLLM's TurboQuant keys: each decoded row is divided by the norm of its level vector "
                           "(norm correction), which no kernel here computes; a decoded view")
