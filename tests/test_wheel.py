"""The wheel, as a user installs it: built from pyproject.toml, installed in a fresh venv outside the checkout
beside the Hugging Face hub's own `kernels` package; there it builds a codec cache, generates, and the
`codeckv` command answers. Offline: the venv reuses the installed dependencies, the hub wheel comes from setup.
"""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import codeckv

ROOT = Path(__file__).resolve().parents[1]
HUB_KERNELS = "0.17.2"  # scripts/setup.sh --dev keeps its wheel in $VENV/wheels

IN_THE_VENV = r"""
import importlib.metadata, importlib.util, sys
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

import codeckv, codeckv.cache.kernel_ops
from codeckv import make_cache
from codeckv.cache.attention import use_codec_attention

assert codeckv.__file__.startswith(sys.prefix), codeckv.__file__
assert codeckv.cache.kernel_ops.PACKAGE == "codeckv_kernels", codeckv.cache.kernel_ops.PACKAGE
# transformers probes the name `kernels` (find_spec, then the distribution's version): the hub's package answers
spec = importlib.util.find_spec("kernels")
assert spec.origin.startswith(sys.prefix) and importlib.metadata.version("kernels") == "HUB_KERNELS", spec.origin
from kernels import get_kernel  # the hub's API, importable beside codeckv's kernels

torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=256)
model = LlamaForCausalLM(config).eval()
use_codec_attention(model)
ids = torch.randint(0, 128, (1, 40))
run = dict(max_new_tokens=24, min_new_tokens=24, do_sample=False)
native = model.generate(ids, cache=DynamicCache(config=config), **run)
lossless = model.generate(ids, cache=make_cache(config, "png"), **run)
assert torch.equal(native, lossless), "png is lossless: the same greedy tokens as the native cache"
cache = make_cache(config, "turbo-4", materialization_free=True)
coded = model.generate(ids, cache=cache, **run)
assert coded.shape == native.shape and cache.footprint().archive_bytes > 0
assert type(cache.layers[0]).__name__ == "CodedLayer" and "codeckv_kernels.decode_attention_torch" in sys.modules
from codeckv_kernels.codes_cpu import SOURCE, codes_status
assert SOURCE.is_file() and SOURCE.parent.name == "codeckv_kernels", SOURCE  # the C source ships in the wheel
print("wheel ok", codeckv.__version__, "|", codes_status())
""".replace("HUB_KERNELS", HUB_KERNELS)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the checkout (assets/ and tests/ included, as `pip install .` sees it)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "out", "build", "*.egg-info",
                                                                "__pycache__", ".pytest_cache", ".ruff_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    str(source), "-w", str(work / "dist")], check=True, cwd=work)
    (built,) = (work / "dist").glob("codeckv-*.whl")
    return built


def test_wheel_ships_the_packages_and_the_licence_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert wheel.name == f"codeckv-{codeckv.__version__}-py3-none-any.whl"
    packages = {str(Path(n).parent).replace("/", ".") for n in names if n.endswith("/__init__.py")}
    expected = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "codeckv").rglob("__init__.py")}
    assert packages == expected | {"codeckv_kernels"}, "every codeckv package, and kernels/ as codeckv_kernels"
    assert {f"codeckv_kernels/{p.name}" for p in (ROOT / "kernels").glob("*.[pc]*")} <= set(names)
    assert not [n for n in names if n.split("/")[0] in ("kernels", "assets", "tests", "app.py")]
    assert any(n.endswith("dist-info/licenses/LICENSE") for n in names)
    metadata = zipfile.ZipFile(wheel).read(f"codeckv-{codeckv.__version__}.dist-info/METADATA").decode()
    assert "License-Expression: MIT" in metadata and "Requires-Dist: transformers<6,>=5.24" in metadata


def test_installed_wheel_generates_beside_the_hub_kernels_package(wheel, fresh_env, tmp_path):
    hub = sorted((Path(sys.prefix) / "wheels").glob(f"kernels-{HUB_KERNELS}-*.whl"))
    assert hub, f"no kernels-{HUB_KERNELS} wheel in {Path(sys.prefix) / 'wheels'}: run scripts/setup.sh --dev"
    python = fresh_env("wheel-venv")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    install = [python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel), str(hub[-1])]
    subprocess.run(install, check=True, cwd=tmp_path, env=env)

    done = subprocess.run([python, "-c", IN_THE_VENV], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"wheel ok {codeckv.__version__}" in done.stdout
    if shutil.which(os.environ.get("CC", "cc")):
        assert "| compiled C (" in done.stdout, "the installed wheel builds its CPU kernel from the shipped source"

    command = python.parent / "codeckv"
    version = subprocess.run([command, "--version"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert (version.returncode, version.stdout.strip()) == (0, f"codeckv {codeckv.__version__}")
    usage = subprocess.run([command, "memory", "--tiers", "nope"], cwd=tmp_path, env=env, capture_output=True,
                           text=True)
    assert usage.returncode == 2 and "unknown tier 'nope'" in usage.stderr
