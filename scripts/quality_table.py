"""The README's and docs/quality.md's tables, written from the committed quality CSVs (no figure typed by hand).

    .venv/bin/python scripts/quality_table.py                   # the headline table: every row, every text
    .venv/bin/python scripts/quality_table.py --full corpus     # one text's whole table (ΔNLL, Δp, the tails)

Reads assets/quality-<model>[-<source>].csv (written by `python -m codeckv quality [--source S] --out ...`) and
prints Markdown. Rows keep the order of the corpus CSV; a source whose CSV is missing is left out.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"corpus": "", "docstrings": "-docstrings", "bible": "-bible"}


def _rows(model: str, source: str) -> dict[str, dict]:
    path = ROOT / "assets" / f"quality-{model}{SOURCES[source]}.csv"
    return {row["tier"]: row for row in csv.DictReader(path.open())} if path.exists() else {}


def _num(row: dict, key: str) -> float:
    value = row.get(key, "")
    return float(value) if value not in ("", None) else math.nan


def _kld(value: float) -> str:
    return f"{value:.4f}" if value < 0.1 else f"{value:.3f}"


def _name(row: dict) -> str:
    return f"`{row['tier']}`" + ("" if row.get("reference", "native") == "native" else " †")


def headline(model: str) -> str:
    texts = {s: _rows(model, s) for s in SOURCES}
    texts = {s: rows for s, rows in texts.items() if rows}
    order = list(next(iter(texts.values())))
    head = ["cache", "stores (vs bf16)", "held while scored (× native)"]
    for source in texts:
        head += [f"KLD {source}", "99%", "top-1"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for tier in order:
        first = next(rows[tier] for rows in texts.values() if tier in rows)
        native = next(iter(texts.values())).get("native")
        beside_native = native is not None and first.get("reference", "native") == "native"
        held = _num(first, "held_bytes") / _num(native, "held_bytes") if beside_native else math.nan
        cells = [_name(first), f"{100 * _num(first, 'ratio_vs_bf16'):.1f}%",
                 "n/a" if math.isnan(held) else f"{held:.2f}×"]
        for rows in texts.values():
            row = rows.get(tier)
            cells += ([_kld(_num(row, "kld")), _kld(_num(row, "kld_p99")), f"{_num(row, 'top1_pct'):.1f}%"]
                      if row else ["", "", ""])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def full(model: str, source: str) -> str:
    rows = _rows(model, source)
    head = ["cache", "vs bf16", "KLD ± se", "KLD 99.9%", "KLD max", "top-1 % ± se", "ΔNLL % ± se", "RMS Δp"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for row in rows.values():
        lines.append("| " + " | ".join([
            _name(row), f"{100 * _num(row, 'ratio_vs_bf16'):.1f}%",
            f"{_kld(_num(row, 'kld'))} ± {_kld(_num(row, 'kld_se'))}", _kld(_num(row, "kld_p999")),
            _kld(_num(row, "kld_max")), f"{_num(row, 'top1_pct'):.1f} ± {_num(row, 'top1_se'):.1f}",
            f"{_num(row, 'delta_nll_pct'):+.2f} ± {_num(row, 'delta_nll_se'):.2f}",
            f"{100 * _num(row, 'dp_rms'):.2f}%",
        ]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--full", choices=list(SOURCES), help="one text's whole table instead of the headline")
    args = parser.parse_args()
    print(full(args.model, args.full) if args.full else headline(args.model))


if __name__ == "__main__":
    main()
