"""First use of a fresh Space: app.py on an empty cache folder (the model not yet converted, no calibration saved),
two visitors at once on two PCA tiers. Both are answered while the background preparation converts the model and
calibrates: their short chats hold their tokens raw, so they wait for the model only and are told that their tier is
still being prepared. The process peak, read once the preparation is done, stays under the bound docs/deploying.md
states (measured by scripts/first_use.py: assets/first-use-smollm2-135m.csv)."""

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from gradio_client import Client

from codeckv.cache.calibration import calibration_path
from codeckv.measure.memory import proc_status_bytes
from codeckv.tiers import TIERS
from tests.app.served import ROOT, free_port, served_process

PLAIN = [False, 8, 0, "4", "same", 32, True, 0, 0, ""]  # the Advanced knobs, unused
PEAK_BOUND_GIB = 4.0  # docs/deploying.md, "First use": two first-use PCA chats at once
ANSWER_SECONDS = 300  # the conversion and two short turns on 2 cores busy calibrating, with margin
PREPARED_SECONDS = 900  # the conversion and one calibration pass of every PCA tier, with margin


def _text(message) -> str:
    content = message["content"]
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content)


def _chat(url: str, tier: str) -> tuple[list, list[str]]:
    """One streamed chat turn -> (the codec panel's last messages, every codec stats text streamed)."""
    job = Client(url, verbose=False).submit("What is the capital of France?", None, None, "smollm2-135m", tier, 8,
                                            False, *PLAIN, api_name="/chat")
    deadline = time.monotonic() + ANSWER_SECONDS
    while not job.done():
        assert time.monotonic() < deadline, f"{tier}: no answer within {ANSWER_SECONDS} s"
        time.sleep(0.2)
    outputs = job.outputs()
    return outputs[-1][1], [output[3] for output in outputs]


def test_two_first_use_pca_chats_are_answered_with_progress_under_the_peak_bound(tmp_path):
    env = {**os.environ, "PORT": str(free_port()), "GRADIO_SERVER_NAME": "127.0.0.1", "HF_HUB_OFFLINE": "1",
           "GRADIO_ANALYTICS_ENABLED": "False", "CODECKV_CACHE": str(tmp_path / "empty"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("CODECKV_MODELS", None)
    env.pop("CODECKV_PREPARE", None)  # the app's default: prepare in the background from its start
    with served_process([sys.executable, "app.py"], env, tmp_path / "app.log") as (url, process):
        with ThreadPoolExecutor(2) as pool:
            turns = dict(zip(("pca-8x", "pca-16x"), pool.map(lambda tier: _chat(url, tier), ("pca-8x", "pca-16x"))))
        files = [tmp_path / "empty" / "calibration" / calibration_path("smollm2-135m", t.joint).name
                 for t in TIERS.values() if t.joint is not None]
        deadline = time.monotonic() + PREPARED_SECONDS
        while not all(f.exists() for f in files):  # the background preparation: every PCA tier, saved
            assert time.monotonic() < deadline, f"not every PCA tier prepared within {PREPARED_SECONDS} s"
            time.sleep(1)
        peak = proc_status_bytes("VmHWM", process.pid)
    for tier, (codec, stats) in turns.items():
        assert codec and _text(codec[-1]).strip(), f"{tier}: answered"
        told = [text for text in stats if text.startswith(f"*{tier} is still being prepared ({tier}: ")]
        assert told, f"{tier}: told its tier is still being prepared: {stats[:3]}"
        assert not any(text.startswith("*Preparing this tier before the turn:") for text in stats), "no wait"
        assert f"**{tier}** holds" in stats[-1] and "raw until 2,048 tokens" in stats[-1], stats[-1]
    assert peak <= PEAK_BOUND_GIB * 2**30, f"process peak {peak / 2**30:.2f} GiB (bound {PEAK_BOUND_GIB} GiB)"
