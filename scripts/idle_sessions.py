"""What idle chat sessions cost a running server, measured through its API (README "Deploying").

    .venv/bin/python scripts/idle_sessions.py --sessions 50 --tier turbo-4 --max-idle-mib 2048

Starts app.py on a free local port with CODECKV_MAX_IDLE_MIB set, then opens `--sessions` sessions one
after the other (one gradio_client each, as separate visitors), each asking one question about the
embedded ~2k-token "try statement" document, and leaves them idle. After each it reads the caches' own
byte counts from the stats lines ("holds X") and the server's RSS from /proc. Then every session asks a
second question: the ones evicted by the bound say so and prefill again; every one must answer.
Prints a table and writes a CSV (default out/idle-sessions-<tier>.csv).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from gradio_client import Client

ROOT = Path(__file__).resolve().parents[1]
PLAIN = [False, 8, 0, "4", "same", 32, True, 0, 0]  # Advanced accordion untouched
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _bytes(stats: str, label: str) -> int:
    """The 'holds X' figure after `label` in a stats line, in bytes."""
    match = re.search(re.escape(label) + r"\*\* holds \**([\d.]+) (B|KiB|MiB|GiB)", stats)
    if match is None:
        raise ValueError(f"no held bytes for {label!r} in: {stats[:300]}")
    return int(float(match.group(1)) * UNITS[match.group(2)])


def _serve(env: dict) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {**os.environ, **env, "PORT": str(port), "GRADIO_SERVER_NAME": "127.0.0.1", "HF_HUB_OFFLINE": "1",
           "GRADIO_ANALYTICS_ENABLED": "False"}
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    for _ in range(240):
        try:
            urllib.request.urlopen(url, timeout=2)
            return proc, url
        except OSError:
            time.sleep(1)
    proc.kill()
    raise RuntimeError("app.py did not start within 240 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--tier", default="turbo-4")
    parser.add_argument("--max-idle-mib", type=int, default=2048, help="CODECKV_MAX_IDLE_MIB of the server")
    parser.add_argument("--tokens", type=int, default=16, help="max new tokens per turn (the Chat allows 8 and more)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from codeckv.measure.table import write_csv
    from codeckv.serve.inputs import DOCUMENTS

    document = next(iter(DOCUMENTS))
    proc, url = _serve({"CODECKV_MAX_IDLE_MIB": str(args.max_idle_mib)})
    rows = []
    try:
        base = _rss(proc.pid)
        clients = []
        for index in range(args.sessions):
            client = Client(url, verbose=False)
            start = time.perf_counter()
            *_, native_stats, codec_stats, _, _, _ = client.predict(
                "What does the finally clause do?", document, None, "smollm2-135m", args.tier, args.tokens, False,
                *PLAIN, api_name="/chat")
            native, codec = _bytes(native_stats, "native cache"), _bytes(codec_stats, args.tier)
            rows.append({"session": index + 1, "turn": 1, "native_held_bytes": native, "codec_held_bytes": codec,
                         "codec_over_native": codec / native, "server_rss_bytes": _rss(proc.pid),
                         "server_rss_growth_bytes": _rss(proc.pid) - base, "seconds": time.perf_counter() - start,
                         "evicted_before": False})
            clients.append(client)
            print(f"session {index + 1}: native {native / 2**20:.1f} MiB, {args.tier} {codec / 2**20:.1f} MiB "
                  f"({codec / native:.3f}x), server RSS {_rss(proc.pid) / 2**20:.0f} MiB", flush=True)
        for index, client in enumerate(clients):
            start = time.perf_counter()
            native_chat, _, native_stats, codec_stats, *_ = client.predict(
                "And the else clause?", None, None, "smollm2-135m", args.tier, args.tokens, False, *PLAIN,
                api_name="/chat")
            answered = bool(native_chat and native_chat[-1]["content"])
            rows.append({"session": index + 1, "turn": 2, "native_held_bytes": _bytes(native_stats, "native cache"),
                         "codec_held_bytes": _bytes(codec_stats, args.tier), "codec_over_native": float("nan"),
                         "server_rss_bytes": _rss(proc.pid), "server_rss_growth_bytes": _rss(proc.pid) - base,
                         "seconds": time.perf_counter() - start,
                         "evicted_before": "released while it was idle" in codec_stats})
            if not answered:
                raise RuntimeError(f"session {index + 1} did not answer its second question")
        peak = max(r["server_rss_bytes"] for r in rows)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    first = [r for r in rows if r["turn"] == 1]
    ratios = sorted(r["codec_over_native"] for r in first)
    evicted = sum(r["evicted_before"] for r in rows if r["turn"] == 2)
    print(f"\n{args.sessions} sessions, {args.tier}, CODECKV_MAX_IDLE_MIB={args.max_idle_mib}: codec half / native "
          f"half of an idle session {ratios[len(ratios) // 2]:.3f} (median; {ratios[0]:.3f}-{ratios[-1]:.3f}); "
          f"server RSS {base / 2**20:.0f} MiB at start, peak {peak / 2**20:.0f} MiB; {evicted} of "
          f"{args.sessions} sessions were evicted while idle and prefilled again; every session answered twice")
    print(f"wrote {write_csv(rows, args.out or ROOT / f'out/idle-sessions-{args.tier}.csv')}")


if __name__ == "__main__":
    main()
