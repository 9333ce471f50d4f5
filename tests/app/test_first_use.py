"""First use of a fresh Space: app.py on an empty cache folder (the model not yet converted, no calibration saved),
two visitors at once on two PCA tiers. Both are answered while the background preparation converts the model and
calibrates: their short chats hold their tokens raw, so they wait for the model only and are told that their tier is
still being prepared. The process peak, read once the preparation is done, stays under the bound docs/deploying.md
states (measured by scripts/first_use.py: assets/first-use-smollm2-135m.csv).

The app under test calibrates its PCA tiers on 2 of their 32 windows (SHORT_CALIBRATION): the same pass, over a
sixteenth of the text (the test 57 s instead of 106 s alone here; 300 s on the whole text). What the pass holds at
once is one window's activations and the rows sampled so far, with their projections while the tiers are fitted;
the whole text's pass samples more rows (every 4th position of 32 windows against every position of 2), so the test
adds what those rows would hold (`rows_beyond_the_short_pass`: 268 MiB for smollm2-135m, computed from the sampling
constants) to the peak it reads before comparing it with the bound. The full pass's own peak is measured by `codeckv
calibrate` (tests/cache/test_calibration.py) and scripts/first_use.py (1,956 MiB)."""

import dataclasses
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from gradio_client import Client

from codeckv.cache.calibration import calibration_path
from codeckv.cache.calibration_fit import SAMPLE_ALL_BELOW, SAMPLE_EVERY, SKIP
from codeckv.codecs.pca import JointPCA
from codeckv.measure.memory import proc_status_bytes
from codeckv.models import model_config
from codeckv.tiers import TIERS, Tier
from tests.app.served import ROOT, free_port, served_process

PLAIN = [False, 8, 0, "4", "same", 32, True, 0, 0, ""]  # the Advanced knobs, unused
PEAK_BOUND_GIB = 4.0  # docs/deploying.md, "First use": two first-use PCA chats at once
ANSWER_SECONDS = 300  # the conversion and two short turns on 2 cores busy calibrating, with margin
PREPARED_SECONDS = 900  # the conversion and one calibration pass of every PCA tier, with margin
SHORT_CALIBRATION = 2  # windows of 512 tokens (JointPCA.calibration_windows: 32)
APP_WITH_SHORT_CALIBRATION = """
import runpy
from codeckv.tiers import TIERS
from tests.app.test_first_use import short
TIERS.update({name: short(tier) for name, tier in TIERS.items() if tier.joint is not None})
runpy.run_path("app.py", run_name="__main__")
"""


def rows_beyond_the_short_pass(spec: JointPCA, layers: int, width: int) -> int:
    """Bytes the whole text's pass holds beyond the short one's: its extra sampled rows of `width` floats in each of
    `layers` full-attention layers, and their projections (calibration_fit._capture's sampling)."""
    def rows(windows: int) -> int:
        positions = spec.calibration_length - SKIP
        every = SAMPLE_EVERY if windows * positions >= SAMPLE_ALL_BELOW else 1
        return windows * len(range(0, positions, every))

    return 2 * max(0, rows(spec.calibration_windows) - rows(SHORT_CALIBRATION)) * layers * width * 4


def short(tier: Tier) -> Tier:
    """`tier`, a PCA tier, calibrated on SHORT_CALIBRATION windows."""
    return dataclasses.replace(tier, joint=dataclasses.replace(tier.joint, calibration_windows=SHORT_CALIBRATION))


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
    app = [sys.executable, "-c", APP_WITH_SHORT_CALIBRATION]
    with served_process(app, env, tmp_path / "app.log") as (url, process):
        with ThreadPoolExecutor(2) as pool:
            turns = dict(zip(("pca-8x", "pca-16x"), pool.map(lambda tier: _chat(url, tier), ("pca-8x", "pca-16x"))))
        files = [tmp_path / "empty" / "calibration" / calibration_path("smollm2-135m", short(t).joint).name
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
    config = model_config()  # the default model's: 30 layers, K and V of 3 heads of 64
    width, layers = 2 * config.num_key_value_heads * config.head_dim, config.num_hidden_layers
    beyond = max(rows_beyond_the_short_pass(t.joint, layers, width) for t in TIERS.values() if t.joint)
    assert peak + beyond <= PEAK_BOUND_GIB * 2**30, (
        f"process peak {peak / 2**30:.2f} GiB + {beyond / 2**20:.0f} MiB the whole text's rows would add "
        f"(bound {PEAK_BOUND_GIB} GiB)")
