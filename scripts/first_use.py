"""What a visitor of a fresh Space waits for, measured through the API: time to the first streamed message, time to
the answer, and the server's peak memory, on an empty cache and then with the background preparation done.

    .venv/bin/python scripts/first_use.py --out assets/first-use-smollm2-135m.csv

Each scenario starts `python app.py` on a free local port with $CODECKV_CACHE pointing at a folder (empty for
the first ones: the model is converted and its PCA tiers calibrated while the app already serves), sends chats
through gradio_client ("What is the capital of France?", 16 new tokens) and reads the server's peak RSS
(VmHWM, /proc/<pid>/status) when they are answered, and again once the background preparation has saved every
PCA tier (the whole first use: conversion, calibration and the chats). Scenarios:

    fresh, pca-8x              one chat on an empty cache
    fresh, pca-8x + pca-16x    two chats at once, two PCA tiers, on an empty cache
    prepared, pca-8x           one chat on the cache the first scenario left (preparation done)
    prepared, turbo-4          the same with a tier that needs no calibration

Prints a table and writes a CSV.
"""

from __future__ import annotations

import argparse
import csv
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gradio_client import Client

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What is the capital of France?"
PLAIN = [False, 8, 0, "4", "same", 32, True, 0, 0, ""]  # the Advanced accordion untouched
START_SECONDS = 120
PREPARED_SECONDS = 900


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _peak_rss(pid: int) -> int:
    """VmHWM of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmHWM")


def _prepared(cache: Path, started: float) -> float:
    """Wait until the background preparation has saved every PCA tier's calibration: seconds since the app started."""
    sys.path.insert(0, str(ROOT))
    from codeckv.cache.calibration import calibration_path
    from codeckv.tiers import TIERS

    files = [cache / "calibration" / calibration_path("smollm2-135m", t.joint).name
             for t in TIERS.values() if t.joint is not None]
    while not all(f.exists() for f in files):
        if time.perf_counter() - started > PREPARED_SECONDS:
            raise RuntimeError(f"the PCA tiers were not prepared within {PREPARED_SECONDS} s")
        time.sleep(0.5)
    return time.perf_counter() - started


def _chat(url: str, tier: str, tokens: int) -> dict:
    """One chat turn, streamed: seconds to the first update and to the last, and the last codec stats."""
    start = time.perf_counter()
    job = Client(url, verbose=False).submit(QUESTION, None, None, "smollm2-135m", tier, tokens, False, *PLAIN,
                                            api_name="/chat")
    first = None
    while not job.done():
        if first is None and job.outputs():
            first = time.perf_counter() - start
        time.sleep(0.05)
    outputs = job.outputs()
    first = first if first is not None else time.perf_counter() - start
    native, codec, _, codec_stats, *_ = outputs[-1]
    waited = [o[3] for o in outputs[:-1] if any(w in o[3] for w in ("Preparing", "Loading", "being prepared"))]
    return {"tier": tier, "first_message_s": round(first, 1), "answer_s": round(time.perf_counter() - start, 1),
            "answered": bool(codec and codec[-1]["content"]), "progress_lines": len(waited),
            "first_progress": waited[0] if waited else ""}


def scenario(label: str, cache: Path, tiers: list[str], tokens: int, log: Path) -> list[dict]:
    """Start the app on `cache`, send one chat per tier at once, stop the app: one row per chat."""
    port = _port()
    env = {**os.environ, "PORT": str(port), "GRADIO_SERVER_NAME": "127.0.0.1", "HF_HUB_OFFLINE": "1",
           "GRADIO_ANALYTICS_ENABLED": "False", "CODECKV_CACHE": str(cache)}
    url = f"http://127.0.0.1:{port}/"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        started = time.perf_counter()
        while True:
            try:
                urllib.request.urlopen(url, timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.perf_counter() - started > START_SECONDS:
                    raise RuntimeError(f"the app did not start:\n{log.read_text()[-2000:]}") from None
                time.sleep(0.5)
        serving = time.perf_counter() - started
        with ThreadPoolExecutor(len(tiers)) as pool:
            rows = list(pool.map(lambda tier: _chat(url, tier, tokens), tiers))
        peak = _peak_rss(proc.pid)
        prepared = _prepared(cache, started)
        whole = _peak_rss(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return [{"scenario": label, **row, "serving_after_s": round(serving, 1), "peak_rss_mib": peak >> 20,
             "prepared_after_s": round(prepared, 1), "peak_rss_prepared_mib": whole >> 20} for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16, help="new tokens per chat (default 16)")
    parser.add_argument("--out", default="out/first-use-smollm2-135m.csv")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="codeckv-first-use-") as work:
        work = Path(work)
        for label, cache, tiers in [("fresh", work / "one", ["pca-8x"]),
                                    ("fresh, two at once", work / "two", ["pca-8x", "pca-16x"]),
                                    ("prepared", work / "one", ["pca-8x"]),
                                    ("prepared", work / "one", ["turbo-4"])]:
            print(f"== {label}: {', '.join(tiers)}", file=sys.stderr, flush=True)
            rows += scenario(label, cache, tiers, args.tokens, work / f"{label}-{tiers[0]}.log")
    columns = list(rows[0])
    print("  ".join(columns))
    for row in rows:
        print("  ".join(str(row[c]) for c in columns))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
