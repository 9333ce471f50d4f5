"""The memory roofline of an op: the least time it can take, moving its bytes at a GPU's HBM bandwidth.

    bound_ms(moved_bytes, "h200")       # ms at 4.8 TB/s
    device_bandwidth("nvidia-h200")     # the bandwidth of a device label (kernels.bench.device_label), or None

A decode step reads every stored byte once (codes, scales, zeros, raw tokens) and does little arithmetic
per byte, so its Triton time over this bound says how far the kernel is from the limit. The three
columns kernels.bench always prints are the GPUs below; a device they do not name gets no ratio.
Bandwidths are the vendors' peak figures (decimal units: 1 TB/s = 1e12 bytes per second).
"""

from __future__ import annotations

BOUND_GPUS = {"h200": 4.8e12, "a100": 2.0e12, "t4": 320e9}  # the roofline columns of kernels.bench, bytes/s
KNOWN_DEVICES = (  # (substring of a device label, bytes/s), the first match wins
    ("h200", 4.8e12),
    ("h100-pcie", 2.0e12),
    ("h100", 3.35e12),  # SXM, HBM3
    ("a100-pcie-40gb", 1.555e12),
    ("a100-sxm4-40gb", 1.555e12),
    ("a100", 2.0e12),  # 80 GB
    ("l40s", 864e9),
    ("l4", 300e9),
    ("t4", 320e9),
)


def bound_ms(moved_bytes: float, gpu: str) -> float:
    """Milliseconds to move `moved_bytes` at the HBM bandwidth of `gpu` (a key of BOUND_GPUS)."""
    return moved_bytes / BOUND_GPUS[gpu] * 1e3


def device_bandwidth(label: str) -> float | None:
    """Peak HBM bandwidth (bytes/s) of a device label such as "nvidia-h100-80gb-hbm3"; None if unknown."""
    for pattern, bandwidth in KNOWN_DEVICES:
        if pattern in label:
            return bandwidth
    return None
