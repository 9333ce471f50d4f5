"""Which machine measured a row: its name and kind, since `seconds` compare only within one kind of node."""

from __future__ import annotations

import platform
import socket
from functools import cache


@cache
def _processor() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform's word for it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def node_columns(node_id: str = "") -> dict[str, str]:
    """{"node": host name (and the Ray node, on a cluster), "node_kind": the GPU it measured on or the CPU and its
    torch threads}."""
    import torch

    if torch.cuda.is_available():
        kind = torch.cuda.get_device_name()
    else:
        threads = torch.get_num_threads()
        kind = f"{_processor()}, {threads} thread{'s' * (threads > 1)}"
    host = socket.gethostname()
    return {"node": f"{host}/{node_id[:8]}" if node_id else host, "node_kind": kind}
