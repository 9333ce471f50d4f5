"""Plain tables for the CLI and benchmarks: aligned text for the terminal, CSV and JSON for files."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path


def format_table(rows: list[dict], columns: list[str] | None = None) -> str:
    """Rows of dicts as an aligned text table; floats with 4 significant digits."""
    if not rows:
        return "(no rows)"
    columns = columns or list(rows[0])
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def write_csv(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: counts_text(v) if isinstance(v, dict) else v for k, v in row.items()} for row in rows)
    return path


def merge_rows(path: str | Path, rows: list[dict], order: list[str], key: str = "tier",
               same: tuple[str, ...] = ()) -> list[dict]:
    """The rows of the CSV at `path` with `rows` replacing those of the same `key` and adding the others, sorted by
    `order` (names not in it last, in the order met). `same`: columns whose values every old and new row must share
    (e.g. the text and its windows), else a ValueError saying which."""
    with Path(path).open(newline="") as f:
        old = list(csv.DictReader(f))
    for column in same:
        values = {str(row.get(column)) for row in [*old, *rows] if row.get(column) not in (None, "")}  # or older
        if len(values) > 1:
            raise ValueError(f"{path}: its rows and the new ones differ in {column} ({', '.join(sorted(values))}): "
                             "update a CSV measured the same way, or write a new one")
    merged = {row[key]: row for row in old} | {row[key]: row for row in rows}
    rank = {name: i for i, name in enumerate(order)}
    names = sorted(merged, key=lambda name: (rank.get(name, len(rank)), list(merged).index(name)))
    return [merged[name] for name in names]


def numbers(row: dict) -> dict:
    """A row read back from a CSV with its numeric cells as floats (text stays text; an empty cell is nan)."""
    return {column: _number(value) for column, value in row.items()}


def _number(value):
    if not isinstance(value, str):
        return value
    if value == "":
        return math.nan
    try:
        return float(value)
    except ValueError:
        return value


def write_json(payload, path: str | Path) -> Path:
    """Strict JSON: inf and nan (e.g. the PSNR of a lossless tier) become null."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_strict(payload), indent=2, default=str, allow_nan=False))
    return path


def _strict(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return counts_text(value)
    return "" if value is None else str(value)


def counts_text(value: dict) -> str:
    """A dict cell as text, e.g. codec layers per attention mode: {"codes": 29, "view": 1} -> "codes 29, view 1"."""
    return ", ".join(f"{key} {item}" for key, item in value.items())


def counts_of(text: str) -> dict[str, int]:
    """counts_text's dict back: "codes 29, view 1" -> {"codes": 29, "view": 1} ("" -> {})."""
    return {key: int(item) for key, _, item in (part.rpartition(" ") for part in text.split(", ") if part)}
