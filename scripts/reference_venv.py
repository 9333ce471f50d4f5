"""A virtualenv of its own for a reference engine (kvpress, vLLM), built once from the package registry.

    python = reference_venv("vllm-0.34.0", [["torch==2.13.0", "triton", ...], ["--no-deps", "vllm==0.34.0"]])

Each list is one `pip install` into $CODECKV_CACHE/<name>-venv, in order; a stamp of the lists marks it built, so a
second call returns at once and a change of pins rebuilds it. The engines pin packages this project pins otherwise
(transformers, torch), which is why they never share the project's environment.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from codeckv.paths import cache_dir


def reference_venv(name: str, installs: list[list[str]]) -> Path:
    """The python of $CODECKV_CACHE/<name>-venv with `installs` done (built once)."""
    venv = cache_dir() / f"{name}-venv"
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    want = "\n".join(" ".join(step) for step in installs)
    if stamp.exists() and stamp.read_text() == want:
        return python
    print(f"building {venv} ({'; '.join(' '.join(step) for step in installs)}) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    for step in installs:
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *step], check=True)
    stamp.write_text(want)
    return python
