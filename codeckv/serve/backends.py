"""Which path each kernel op takes, per tier, on a loaded model's device, and why (the model panel's table).

    tier_backends("cuda", head_dim=64, dtype="bfloat16")["turbo-4"]["attention"]  # "triton decode_attention ..."

Codec tiers ask the kernels themselves (`op_backends`: the same checks the ops run); a PCA tier has
no per-tensor codec: its chunks are projected in torch and entropy-coded by kernels/ans_cpu.c where it is built
(else numpy), and no kernel reads them; a press alone stores nothing coded.
"""

from __future__ import annotations

import functools

import torch

from codeckv.cache.kernel_ops import ans_status, op_backends
from codeckv.tiers import TIERS

OPS = ("encode", "decode", "attention")  # archiving a block, the decoded view, attention on the codes
PCA_ATTENTION = "refused (no kernel reads entropy-coded chunks): attention reads the decoded view"
PRESS_PATH = "none (a press alone keeps the tokens it does not evict raw; its scoring runs in torch)"
PRESS_ATTENTION = "SDPA on the kept raw tokens"


@functools.cache
def tier_backends(device: str, head_dim: int, dtype: str) -> dict[str, dict[str, str]]:
    """tier name -> {"encode", "decode", "attention"} -> path; K and V shown apart only where they differ."""
    device_type = torch.device(device).type
    table = {}
    for name, tier in TIERS.items():
        if tier.is_native:
            continue
        if tier.joint is not None:
            table[name] = {"encode": _pca_path(), "decode": _pca_path(), "attention": PCA_ATTENTION}
            continue
        if tier.key is None:  # a press alone
            table[name] = {"encode": PRESS_PATH, "decode": PRESS_PATH, "attention": PRESS_ATTENTION}
            continue
        tier = tier.for_head_dims(head_dim, head_dim)  # as the cache fits it to the model's heads (codecs/fit.py)
        paths = op_backends(tier.key, tier.value, device_type, head_dim, getattr(torch, dtype))
        table[name] = {op: _both(paths[f"{op} K"], paths[f"{op} V"]) for op in ("encode", "decode")}
        table[name]["attention"] = paths["attention"]
    return table


def _pca_path() -> str:
    """A PCA tier's coding path: the projection in torch, the entropy coder compiled or in numpy (and why)."""
    status = ans_status()
    coder = f"ans_cpu, {status}" if status.startswith("compiled") else f"numpy, {status}"
    return f"torch joint PCA (codeckv/cache/pca_layer.py) + ANS ({coder}); no kernel reads entropy-coded chunks"


def _both(key: str, value: str) -> str:
    """One path for K and V, or each side's."""
    return key if key == value else f"K: {key} · V: {value}"
