"""First use of a fresh Space: app.py on an empty cache folder (the model not yet converted, no calibration saved),
two visitors at once on two PCA tiers. Both are answered, both are told what they wait for while the background
preparation converts the model and calibrates, and the process peak stays under the bound docs/deploying.md states
(measured by scripts/first_use.py: assets/first-use-smollm2-135m.csv)."""

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from gradio_client import Client

from codeckv.measure.memory import proc_status_bytes
from tests.app.served import ROOT, free_port, served_process

PLAIN = [False, 8, 0, "4", "same", 32, True, 0, 0, ""]  # the Advanced knobs, unused
PEAK_BOUND_GIB = 4.0  # docs/deploying.md, "First use": two first-use PCA chats at once
ANSWER_SECONDS = 900  # conversion and one calibration pass on 2 busy cores, with margin


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
        peak = proc_status_bytes("VmHWM", process.pid)
    for tier, (codec, stats) in turns.items():
        assert codec and _text(codec[-1]).strip(), f"{tier}: answered"
        waited = [text for text in stats if text.startswith("*Preparing this tier before the turn:")]
        assert waited, f"{tier}: told what it waited for: {stats[:3]}"
        assert any(f"{tier}: calibrating" in text or f"{tier}: queued" in text for text in waited), waited
        assert f"**{tier}** holds" in stats[-1], f"{tier}: the turn's stats at the end"
    assert any("calibrating, " in text for _, stats in turns.values() for text in stats), "a progress figure"
    assert (tmp_path / "empty" / "calibration").is_dir(), "the calibrations were saved for the next start"
    assert peak <= PEAK_BOUND_GIB * 2**30, f"process peak {peak / 2**30:.2f} GiB (bound {PEAK_BOUND_GIB} GiB)"
