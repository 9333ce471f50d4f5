"""Shared test set-up: offline, Triton through its interpreter on CPU, one thread per xdist worker, one model load per
session, fresh venvs."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel import; a GPU run sets TRITON_INTERPRET=0
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):  # make test's two workers share the cores: one thread each, and for the
    os.environ["OMP_NUM_THREADS"] = "1"  # processes a test starts, so no test compares numbers from two thread counts

import pytest  # noqa: E402

# setuptools (torch.utils.cpp_extension imports it: optimum-quanto's peers) installs its distutils shim when first
# imported; imported here, before any test patches importlib to hide a package, it always finds its own copy (a
# first import under such a patch fell back to the stdlib distutils in CI and failed every quanto test after it).
import setuptools  # noqa: E402, F401
import torch  # noqa: E402

torch.manual_seed(0)
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def loaded():
    """The embedded default model, loaded once (converted on the first run, then read from the copy)."""
    from codeckv.models import load_model

    return load_model()


def build_tiny_gemma3():
    """A random-weight 6-layer Gemma 3 (full attention on layers 2 and 5, sliding window elsewhere): the hybrid case."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, sliding_window=16, max_position_embeddings=256,
        layer_types=["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2 + ["full_attention"],
    )
    torch.manual_seed(0)
    return Gemma3ForCausalLM(config).eval()


@pytest.fixture
def tiny_gemma3():
    """A fresh tiny hybrid Gemma 3 per test (build_tiny_gemma3)."""
    return build_tiny_gemma3()


@pytest.fixture(scope="session")
def tiny_gemma3_builder():
    """The builder itself, for module-scoped fixtures that build the model once (conftest is not importable by
    name: tests/measure has its own)."""
    return build_tiny_gemma3


@pytest.fixture(scope="session")
def fresh_env(tmp_path_factory):
    """fresh_env(name, hide=()) -> the python of a new venv outside the checkout, offline.

    It sees the packages this environment installed (no download: a .pth adds a folder of links to
    this site-packages), except those whose top-level or dist-info name starts with one of `hide`;
    nothing of the checkout is on its path (run it without PYTHONPATH, from outside the checkout).
    """
    shared = Path(sysconfig.get_paths()["purelib"])

    def make(name: str, hide: tuple[str, ...] = ()) -> Path:
        root = tmp_path_factory.mktemp(name)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
        python = root / "venv" / "bin" / "python"
        links = root / "shared-site-packages"
        links.mkdir()
        for entry in shared.iterdir():
            if not entry.name.startswith(hide):  # startswith(()) is False: nothing hidden
                (links / entry.name).symlink_to(entry)
        site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        Path(site, "shared-packages.pth").write_text(f"import site; site.addsitedir({str(links)!r})\n")
        return python

    return make


# The longest files first (docs/testing.md, "How long it takes"): make test's two workers each take a file at a time
# in this order, so neither is left running a long one alone at the end. Within a file the order stays as written.
LONGEST_FIRST = ("tests/app/test_first_use.py", "tests/measure/test_chat.py", "tests/app/test_browser.py",
                 "tests/presses/test_kvpress_reference.py", "tests/cache/test_calibration.py",
                 "tests/app/test_hostile.py", "tests/grid/test_cluster.py")
ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        path = Path(item.path).relative_to(ROOT).as_posix()
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable
