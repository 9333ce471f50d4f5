"""Serve app.py for the API and browser tests with its model loader watched.

The embedded default loads as usual. FAKE_SLOW_MODEL (listed in $CODECKV_MODELS by the fixture) takes
$CODECKV_TEST_SLOW_LOAD_S seconds and then fails, to show that a slow load does not hold up other
users. Any other name reaching the loader is a bug: the call fails loudly, and the test that sent the
name sees "the loader was called" instead of the refusal it expects.
"""

import os
import runpy
import time
from pathlib import Path

import codeckv.serve.pool
from codeckv.models import DEFAULT_MODEL, ModelUnavailableError, load_model

FAKE_SLOW_MODEL = "fake/slow-model"


def watched_loader(name: str):
    if name == FAKE_SLOW_MODEL:
        time.sleep(float(os.environ.get("CODECKV_TEST_SLOW_LOAD_S", "30")))
        raise ModelUnavailableError(f"{FAKE_SLOW_MODEL} is a test stand-in that only takes time to load")
    if name != DEFAULT_MODEL:
        raise AssertionError(f"the loader was called for {name!r}")
    return load_model(name)


if __name__ == "__main__":
    codeckv.serve.pool.POOL._loader = watched_loader
    runpy.run_path(str(Path(__file__).resolve().parents[2] / "app.py"), run_name="__main__")
