"""Compile a compiled CPU kernel's C sources once per machine into the codeckv cache, and load it.

    lib, status = compiled("codes_cpu", sources, flags)   # (ctypes.CDLL, "C compiler name") or (None, "why not")

The sources (C files and headers; only the .c files are passed to the compiler) are compiled together with
the C compiler found (`$CC`, else `cc`) into the codeckv cache (CODECKV_CACHE, default ~/.cache/codeckv)
under `kernels/<name>-<machine>-<hash>.so`, the hash taken over the sources, the flags, the CPU's feature
flags and the compiler's path, so a copied cache never runs code built for another CPU. A library is built
aside and moved in whole, so two processes building it at once each load a complete one. No compiler, a
failed build or a library that does not load: None, and a sentence that says why (the callers run their
reference path then). Built at most once per process for a set of sources and flags.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

BUILD_TIMEOUT_S = 120


def _cpu_flags() -> str:
    """The CPU's feature flags (Linux), else the machine name: part of the build's name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_dir() -> Path:
    return Path(os.environ.get("CODECKV_CACHE", Path.home() / ".cache" / "codeckv")) / "kernels"


@functools.cache
def compiled(name: str, sources: tuple[Path, ...], flags: tuple[str, ...]) -> tuple[ctypes.CDLL | None, str]:
    """(the library built from `sources` with `flags`, the compiler's name) or (None, why not): module docstring."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return None, "no C compiler: install gcc or clang, or set CC"
    try:
        text = [path.read_bytes() for path in sources]
    except OSError as err:  # an installed wheel without the C files (package-data) cannot build it
        return None, f"{name}'s sources are incomplete here: {err}"
    key = hashlib.sha256(b"\0".join([*text, " ".join(flags).encode(), _cpu_flags().encode(),
                                      compiler.encode()])).hexdigest()
    target = _cache_dir() / f"{name}-{platform.machine()}-{key[:16]}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:  # built aside, then moved in whole
            built = Path(tmp) / target.name
            c_files = [str(path) for path in sources if path.suffix == ".c"]
            try:
                run = subprocess.run([compiler, *flags, *c_files, "-o", str(built), "-lm"],
                                     capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired) as err:
                return None, f"building {name} failed: {err}"
            if run.returncode != 0:
                last = (run.stderr.strip().splitlines() or ["no message"])[-1]
                return None, f"building {name} failed: {last}"
            os.replace(built, target)
    try:
        return ctypes.CDLL(str(target)), Path(compiler).name
    except OSError as err:
        return None, f"loading {target.name} failed: {err}"
