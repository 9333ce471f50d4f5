"""A launched app for the API and browser tests: app.py on a free port, with its loader watched, stopped afterwards."""

import os
import sys

import pytest

from tests.app.served import ROOT, free_port, served


@pytest.fixture(scope="session")
def app_url(tmp_path_factory):
    env = {**os.environ, "PORT": str(free_port()), "GRADIO_SERVER_NAME": "127.0.0.1", "HF_HUB_OFFLINE": "1",
           "GRADIO_ANALYTICS_ENABLED": "False", "CODECKV_MODELS": "fake/slow-model", "CODECKV_TEST_SLOW_LOAD_S": "40",
           "CODECKV_PREPARE": "0",  # background preparation has its own test (test_first_use.py); here it would
           # only compete for the cores with the test's own requests
           "CODECKV_MAX_REQUEST_SECONDS": "3600",  # past every test's own deadline: on a busy machine no test races
           # the server's budget (the budget itself: tests/serve, tests/app/test_handlers.py)
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with served([sys.executable, "tests/app/serve_watched.py"], env, tmp_path_factory.mktemp("app") / "app.log") as url:
        yield url
