"""The kernels package: public names bound to the ops, and importable by transformers' hub-kernel probe."""

import subprocess
import sys
from pathlib import Path

from kernels import ops

ROOT = Path(__file__).resolve().parents[2]


def test_package_names_are_the_dispatching_ops():
    import kernels

    for name in ops.__all__:
        assert getattr(kernels, name) is getattr(ops, name), name
    assert kernels.backend_name("cpu") == "torch" and kernels.backend_name("cuda") == "triton"


def test_transformers_models_import_first_from_the_repository_root():
    """transformers imports any top-level `kernels` package while it loads; ours must not re-enter it."""
    code = "from transformers import Gemma3ForCausalLM, LlamaForCausalLM; import kernels; kernels.Raw"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
