"""Bit packing of b-bit integer codes into uint8 bytes along the last axis.

Bit order (what the Triton kernels unpack): the codes of one row form a
little-endian bit stream. Code i occupies stream bits [i*b, (i+1)*b), its least
significant bit first; stream bit j is bit (j % 8) of byte j // 8. Concretely:

    bits=8: byte i = c[i]
    bits=4: byte i = c[2i] | c[2i+1] << 4
    bits=2: byte i = c[4i] | c[4i+1] << 2 | c[4i+2] << 4 | c[4i+3] << 6
    bits=3: 8 codes -> 3 bytes; with w = c[8u] | c[8u+1] << 3 | ... | c[8u+7] << 21,
            bytes 3u, 3u+1, 3u+2 = w & 0xFF, (w >> 8) & 0xFF, (w >> 16) & 0xFF

A row of n codes packs into n*bits/8 bytes, so n*bits must be a multiple of 8.
(The 2- and 4-bit fast paths read the codes of one byte as a little-endian word, as on x86 and ARM.)
"""

from __future__ import annotations

import math

import torch

ALLOWED_BITS = (2, 3, 4, 8)


def check_bits(bits: int, name: str) -> None:
    """Raise ValueError unless bits is one of ALLOWED_BITS."""
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in ALLOWED_BITS:
        raise ValueError(f"{name}: bits={bits!r} is not supported (allowed: {ALLOWED_BITS})")


def pack_unit(bits: int) -> tuple[int, int]:
    """(codes, bytes) of the smallest run of codes that fills whole bytes: 8 codes -> 3 bytes at 3 bits."""
    codes = 8 // math.gcd(8, bits)
    return codes, codes * bits // 8


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integer codes in [0, 2**bits) along the last axis: (..., n) -> (..., n*bits/8) uint8."""
    check_bits(bits, "pack_bits")
    n = codes.shape[-1]
    unit_codes, unit_bytes = pack_unit(bits)
    if n % unit_codes:
        raise ValueError(
            f"pack_bits: a row of {n} codes at {bits} bits does not fill whole bytes "
            f"(the row length must be a multiple of {unit_codes})"
        )
    if bits == 8:
        return codes.to(torch.uint8)
    if bits in (2, 4):  # the codes of one byte as one little-endian word w: byte = low byte of OR_i (w >> i*(8-bits))
        word = codes.to(torch.uint8).contiguous().view(torch.int16 if bits == 4 else torch.int32)
        packed = word | (word >> (8 - bits))
        for i in range(2, unit_codes):
            packed |= word >> (i * (8 - bits))
        return packed.to(torch.uint8)
    device = codes.device
    units = codes.to(torch.int32).reshape(*codes.shape[:-1], n // unit_codes, unit_codes)
    code_shift = torch.arange(unit_codes, device=device, dtype=torch.int32) * bits
    words = (units << code_shift).sum(-1, dtype=torch.int32)  # (..., n/u), at most 24 bits used
    byte_shift = torch.arange(unit_bytes, device=device, dtype=torch.int32) * 8
    packed = (words.unsqueeze(-1) >> byte_shift) & 0xFF  # (..., n/u, bytes per unit)
    return packed.reshape(*codes.shape[:-1], n * bits // 8).to(torch.uint8)


def unpack_bits(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of pack_bits: (..., m) uint8 -> (..., m*8/bits) int64 codes."""
    return unpack_uint8(packed, bits).to(torch.int64)


def unpack_uint8(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of pack_bits as uint8 codes: (..., m) uint8 -> (..., m*8/bits) uint8 (not an index: cast first)."""
    check_bits(bits, "unpack_bits")
    m = packed.shape[-1]
    unit_codes, unit_bytes = pack_unit(bits)
    if m % unit_bytes:
        raise ValueError(
            f"unpack_bits: a row of {m} bytes is not a whole number of {bits}-bit units "
            f"(the row length must be a multiple of {unit_bytes})"
        )
    if bits == 8:
        return packed
    if bits in (2, 4):  # code i of a byte: (byte >> i*bits) & mask, interleaved back in order
        mask = (1 << bits) - 1
        codes = packed.new_empty(*packed.shape, unit_codes)
        for i in range(unit_codes):
            torch.bitwise_and(packed >> (i * bits), mask, out=codes[..., i])
        return codes.reshape(*packed.shape[:-1], m * unit_codes)
    device = packed.device
    units = packed.to(torch.int32).reshape(*packed.shape[:-1], m // unit_bytes, unit_bytes)
    byte_shift = torch.arange(unit_bytes, device=device, dtype=torch.int32) * 8
    words = (units << byte_shift).sum(-1, dtype=torch.int32)  # (..., m/bytes per unit)
    code_shift = torch.arange(unit_codes, device=device, dtype=torch.int32) * bits
    codes = (words.unsqueeze(-1) >> code_shift) & ((1 << bits) - 1)  # (..., m/bpu, u)
    return codes.reshape(*packed.shape[:-1], m * 8 // bits).to(torch.uint8)
