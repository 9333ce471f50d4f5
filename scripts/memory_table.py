"""docs' memory tables, written from a memory CSV (no figure typed by hand).

    .venv/bin/python scripts/memory_table.py assets/memory-smollm2-135m-presses.csv

Reads a CSV written by `python -m codeckv memory --out ...` and prints one Markdown row per (context, tier, mode):
what the cache holds after the turn, that over native's, at rest, and the process's peak (MiB).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

MODES = {"native": "", "codes": " (on its codes)", "view": " (decoded view)"}


def table(path: Path) -> str:
    lines = ["| context | cache | held | × native | at rest | process peak |", "|---:|---|---:|---:|---:|---:|"]
    for row in csv.DictReader(path.open(newline="")):
        mib = {key: float(row[key]) / 2**20 for key in ("held_bytes", "at_rest_bytes", "process_peak_bytes")}
        lines.append(f"| {int(row['context']):,} | {row['tier']}{MODES.get(row['mode'], row['mode'])} | "
                     f"{mib['held_bytes']:.1f} MiB | {float(row['held_vs_native']):.3f} | "
                     f"{mib['at_rest_bytes']:.1f} MiB | {mib['process_peak_bytes']:.1f} MiB |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path, help="a memory CSV")
    print(table(parser.parse_args().csv))


if __name__ == "__main__":
    main()
