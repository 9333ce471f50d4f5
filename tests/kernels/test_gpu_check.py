"""scripts/gpu_check.sh, without running it (its --dry-run runs the model for minutes): it parses, refuses unknown
flags, and every `python -m` module it runs exists, with the options it passes."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def test_the_script_parses_and_refuses_unknown_flags():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    run = subprocess.run(["bash", str(SCRIPT), "--fast"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and "unknown flag '--fast'" in run.stderr


def test_every_module_it_runs_exists():
    modules = set(re.findall(r'"\$PY" -m ([\w.]+)', SCRIPT.read_text()))
    assert {"kernels.compile_check", "kernels.device_check", "kernels.bench", "codeckv", "pytest"} <= modules
    assert all(importlib.util.find_spec(name) is not None for name in modules), modules


def test_the_compile_check_options_it_passes_are_the_commands():
    """The dry run's subset names options kernels.compile_check takes (a renamed option would fail only there)."""
    subset = re.search(r"compile=\(([^)]*)\)", SCRIPT.read_text()).group(1).split()
    options = {word for word in subset if word.startswith("--")}
    usage = subprocess.run([sys.executable, "-m", "kernels.compile_check", "--help"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert usage.returncode == 0, usage.stderr
    assert options and all(option in usage.stdout for option in options), (options, usage.stdout)
