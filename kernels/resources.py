"""What a compiled GPU kernel uses per program, and how many of its programs an SM then holds at once.

    used = Resources(registers=96, stack_bytes=0, local_bytes=0, shared_bytes=4096, num_warps=4)
    occupancy(used, SM_LIMITS[90])   # Occupancy(programs=5, warps=20, limited_by="registers")

The limits are NVIDIA's for compute capability 8.0 (A100) and 9.0 (H100, H200): registers are allocated
per warp in units of 256 from 65536 per SM; an SM holds at most 64 warps and 32 programs (thread blocks);
shared memory per SM is 164 KiB (sm_80) or 228 KiB (sm_90), of which the driver reserves 1 KiB per program.
kernels/compile_check.py fills Resources from cuobjdump for every kernel configuration the tiers use.
"""

from __future__ import annotations

from dataclasses import dataclass

WARP_SIZE = 32
REGISTER_UNIT = 256  # registers are allocated to a warp in multiples of this
RESERVED_SHARED = 1024  # bytes of shared memory the driver reserves per program


@dataclass(frozen=True)
class SMLimits:
    """One streaming multiprocessor's resources."""

    registers: int
    warps: int
    programs: int
    shared_bytes: int


SM_LIMITS = {
    80: SMLimits(registers=65536, warps=64, programs=32, shared_bytes=164 * 1024),
    90: SMLimits(registers=65536, warps=64, programs=32, shared_bytes=228 * 1024),
}


@dataclass(frozen=True)
class Resources:
    """One compiled kernel's needs, per thread (registers, stack, local) and per program (shared, warps)."""

    registers: int
    stack_bytes: int  # spills (and any stack frame) per thread
    local_bytes: int  # local memory per thread besides the stack
    shared_bytes: int  # static + dynamic shared memory per program
    num_warps: int


@dataclass(frozen=True)
class Occupancy:
    """Programs (and their warps) an SM runs at once, and the resource that limits them."""

    programs: int
    warps: int
    limited_by: str  # "registers", "shared memory", "warps" or "programs"


def occupancy(used: Resources, sm: SMLimits) -> Occupancy:
    """The programs per SM `used` allows: the smallest of the register, shared memory, warp and program limits."""
    per_warp = -(-used.registers * WARP_SIZE // REGISTER_UNIT) * REGISTER_UNIT
    limits = {
        "registers": sm.registers // per_warp // used.num_warps if per_warp else sm.programs,
        "shared memory": sm.shared_bytes // (used.shared_bytes + RESERVED_SHARED),
        "warps": sm.warps // used.num_warps,
        "programs": sm.programs,
    }
    limited_by = min(limits, key=limits.get)
    programs = limits[limited_by]
    return Occupancy(programs, programs * used.num_warps, limited_by)
