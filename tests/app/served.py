"""Serve app.py for a test: start it on a free local port, wait until it answers, stop it afterwards.

    with served([python, "app.py"], env, log_path) as url:
        ...
    with served_process([python, "app.py"], env, log_path) as (url, process):   # its pid too (/proc/<pid>/status)
        ...
"""

import contextlib
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
START_SECONDS = 180  # model load included


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(command: list[str], env: dict, log: Path):
    """Run `command` from the checkout with env (which must carry PORT); yield its URL once it answers."""
    with served_process(command, env, log) as (url, _):
        yield url


@contextlib.contextmanager
def served_process(command: list[str], env: dict, log: Path):
    """served, yielding (URL, the subprocess.Popen)."""
    url = f"http://127.0.0.1:{env['PORT']}/"
    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + START_SECONDS
        while True:
            if proc.poll() is not None:
                pytest.fail(f"{' '.join(command)} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                if time.time() > deadline:
                    pytest.fail(f"the app did not answer within {START_SECONDS} s:\n{log.read_text()[-3000:]}")
                time.sleep(1)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
