"""Where codeckv keeps what it computes once: converted models, PCA calibrations, the compiled CPU kernel."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$CODECKV_CACHE, default ~/.cache/codeckv (kernels/codes_cpu.py reads it too)."""
    return Path(os.environ.get("CODECKV_CACHE", Path.home() / ".cache" / "codeckv"))
