"""The README's long-context table from a CSV of `python -m codeckv ruler`: per tier, the RULER average over the
tasks measured at each length (with the tasks counted) beside what the tier stores and holds at the longest length.

    .venv/bin/python scripts/ruler_table.py assets/ruler-smollm2-135m.csv [--tasks-table]

--tasks-table prints instead one column per task (score ± its standard error over the samples), one table per
length; --costs what each tier's own work (its cache built from the shared prefill, the question and the answer)
cost against the sample's native prefill, over the tasks: the median, the largest, and the median beyond native's
own question and answer.

    .venv/bin/python scripts/ruler_table.py assets/ruler-smollm2-135m-samples.csv --versus native --length 2048

--versus (a samples CSV, one row per sample and tier) compares each tier with a reference on the same samples: the
RULER average ± its standard error (the tasks' means over their samples, averaged; the tasks' errors combined), and
the difference from the reference ± its standard error, paired sample by sample; a difference within twice that
error is "cannot be told apart".

    .venv/bin/python scripts/ruler_table.py assets/ruler-qwen2.5-coder-0.5b-samples.csv --versus native \\
        --haystack assets/ruler-qwen2.5-coder-0.5b-docstrings-samples.csv

--haystack sets two samples CSVs of the same grid on two haystacks side by side: each tier's loss against the
reference on each, over the tasks both measured, and whether (and on which tasks) they differ by more than twice
their combined error.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from codeckv.measure.long_tasks import TASK_NAMES  # noqa: E402
from codeckv.measure.reasoning_summary import mean_se  # noqa: E402
from codeckv.tiers import TIERS  # noqa: E402


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _tiers(rows: list[dict]) -> list[str]:
    """The tiers measured, in the presets' order (native first), then the peers."""
    names = list(dict.fromkeys(r["tier"] for r in rows))
    order = {name: i for i, name in enumerate(TIERS)}
    return sorted(names, key=lambda name: order.get(name, len(order)))


def averages(rows: list[dict]) -> str:
    lengths = sorted({int(r["length"]) for r in rows})
    head = (f"| cache | stores (vs bf16) | held after a {lengths[-1]:,}-token context |"
            + "".join(f" RULER avg at {n:,} |" for n in lengths))
    lines = [head, "|---|---:|---:|" + "---:|" * len(lengths)]
    for tier in _tiers(rows):
        mine = [r for r in rows if r["tier"] == tier]
        stored = sum(float(r["stored_vs_bf16"]) for r in mine) / len(mine)
        longest = [float(r["held_bytes"]) for r in mine if int(r["length"]) == lengths[-1]]
        held = sum(longest) / len(longest) if longest else 0.0
        cells = []
        for n in lengths:
            scores = [float(r["score"]) for r in mine if int(r["length"]) == n]
            cells.append(f" {sum(scores) / len(scores):.1f} ({len(scores)} tasks) |" if scores else " |")
        held_text = f"{held / 2**20:.1f} MiB" if held else "(llama.cpp's)" if tier.startswith("llamacpp") else ""
        lines.append(f"| `{tier}` | {100 * stored:.1f}% | {held_text} |" + "".join(cells))
    return "\n".join(lines)


def per_task(rows: list[dict]) -> str:
    out = []
    for n in sorted({int(r["length"]) for r in rows}):
        at = [r for r in rows if int(r["length"]) == n]
        measured = {r["task"] for r in at}
        tasks = [t for t in TASK_NAMES if t in measured] + sorted(measured - set(TASK_NAMES))
        lines = [f"{n:,} tokens", "", "| cache |" + "".join(f" {t} |" for t in tasks),
                 "|---|" + "---:|" * len(tasks)]
        for tier in _tiers(at):
            cell = {r["task"]: r for r in at if r["tier"] == tier}
            text = []
            for t in tasks:
                if t not in cell:
                    text.append(" |")
                    continue
                se = float(cell[t]["score_se"]) if cell[t]["score_se"] not in ("", "nan") else math.nan
                text.append(f" {float(cell[t]['score']):.0f}" + (f" ± {se:.0f}" if math.isfinite(se) else "") + " |")
            lines.append(f"| `{tier}` |" + "".join(text))
        out.append("\n".join(lines))
    return "\n\n".join(out)


def costs(rows: list[dict]) -> str:
    out = []
    for n in sorted({int(r["length"]) for r in rows}):
        at = [r for r in rows if int(r["length"]) == n and r["prefill_share"] not in ("", "nan")]
        native = {r["task"]: float(r["prefill_share"]) for r in at if r["tier"] == "native"}
        lines = [f"{n:,} tokens", "", "| cache | tasks | median share of the native prefill | largest (task) | "
                 "median beyond native's answer |", "|---|---:|---:|---:|---:|"]
        for tier in _tiers(at):
            mine = [r for r in at if r["tier"] == tier]
            shares = [float(r["prefill_share"]) for r in mine]
            worst = max(mine, key=lambda r: float(r["prefill_share"]))
            beyond = [float(r["prefill_share"]) - native[r["task"]] for r in mine if r["task"] in native]
            extra = f"{100 * statistics.median(beyond):.1f}%" if beyond and tier != "native" else ""
            lines.append(f"| `{tier}` | {len(mine)} | {100 * statistics.median(shares):.1f}% | "
                         f"{100 * float(worst['prefill_share']):.1f}% ({worst['task']}) | {extra} |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def _by_task(rows: list[dict], tier: str, reference: str, length: int) -> dict[str, tuple]:
    """Per task measured for `tier` at `length`: (samples, score mean, its se, mean difference from `reference` on
    the same samples, its se)."""
    at = [r for r in rows if int(r["length"]) == length]
    score = {(r["task"], r["sample"], r["tier"]): float(r["score"]) for r in at}
    found = {}
    for task in [t for t in TASK_NAMES if any(r["task"] == t for r in at)]:
        samples = sorted({r["sample"] for r in at if r["task"] == task and r["tier"] == tier})
        if samples:
            mine = [score[task, s, tier] for s in samples]
            delta = [score[task, s, tier] - score[task, s, reference] for s in samples if (task, s, reference) in score]
            found[task] = (len(mine), *mean_se(mine), *mean_se(delta))
    return found


def _combined(found: dict[str, tuple], tasks: list[str]) -> tuple[float, float, float, float]:
    """The RULER average over `tasks` ± its se, and the difference from the reference ± its se (errors combined)."""
    k = len(tasks)
    mean = statistics.fmean(found[t][1] for t in tasks)
    diff = statistics.fmean(found[t][3] for t in tasks)
    return (mean, math.sqrt(sum(found[t][2] ** 2 for t in tasks)) / k,
            diff, math.sqrt(sum(found[t][4] ** 2 for t in tasks)) / k)


def versus(rows: list[dict], reference: str, length: int) -> str:
    lines = [f"| cache | samples a task | RULER avg ± se | vs `{reference}` ± se (paired) | told apart (> 2 se) |",
             "|---|---:|---:|---:|---|"]
    for tier in _tiers([r for r in rows if int(r["length"]) == length]):
        found = _by_task(rows, tier, reference, length)
        mean, se, diff, diff_se = _combined(found, list(found))
        apart = ("–" if tier == reference else "too few samples" if math.isnan(diff_se)
                 else "yes" if abs(diff) > 2 * diff_se else "no")
        counts = [n for n, *_ in found.values()]
        counted = f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"
        lines.append(f"| `{tier}` | {counted} ({len(found)} tasks) | {mean:.1f} ± {se:.1f} | "
                     f"{diff:+.1f} ± {diff_se:.1f} | {apart} |")
    return "\n".join(lines)


def haystacks(rows: list[dict], other: list[dict], reference: str, length: int) -> str:
    """Each tier's loss against `reference` in two samples CSVs of the same grid on two haystacks, over the tasks
    both measured: the losses, their difference ± its se (independent samples), and the tasks where the two
    haystacks' losses differ by more than twice their combined error."""
    named = [next((r.get("haystack") or "?" for r in table), "?") for table in (rows, other)]
    lines = [f"| cache | tasks | vs `{reference}`, {named[0]} | vs `{reference}`, {named[1]} | difference ± se | "
             "depends on the haystack (> 2 se) | tasks where it does |", "|---|---:|---:|---:|---:|---|---|"]
    at_other = {r["tier"] for r in other if int(r["length"]) == length}
    for tier in [t for t in _tiers([r for r in rows if int(r["length"]) == length]) if t in at_other]:
        if tier == reference:
            continue
        first, second = _by_task(rows, tier, reference, length), _by_task(other, tier, reference, length)
        tasks = [t for t in first if t in second]
        *_, a, a_se = _combined(first, tasks)
        *_, b, b_se = _combined(second, tasks)
        gap, gap_se = b - a, math.hypot(a_se, b_se)
        where = [t for t in tasks if abs(second[t][3] - first[t][3]) > 2 * math.hypot(first[t][4], second[t][4])]
        lines.append(f"| `{tier}` | {len(tasks)} | {a:+.1f} ± {a_se:.1f} | {b:+.1f} ± {b_se:.1f} | "
                     f"{gap:+.1f} ± {gap_se:.1f} | {'yes' if abs(gap) > 2 * gap_se else 'no'} | "
                     f"{', '.join(where) or '–'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path)
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--tasks-table", action="store_true", help="one column per task instead")
    shown.add_argument("--costs", action="store_true", help="each tier's own seconds against the native prefill")
    shown.add_argument("--versus", metavar="TIER", help="a samples CSV: each tier against TIER, paired by sample")
    parser.add_argument("--length", type=int, default=4096, help="--versus: the length compared (default 4096)")
    parser.add_argument("--haystack", type=Path, metavar="CSV",
                        help="with --versus: the same grid's samples CSV on another haystack, each tier's loss in both")
    args = parser.parse_args()
    rows = _rows(args.csv)
    if args.haystack:
        print(haystacks(rows, _rows(args.haystack), args.versus or "native", args.length))
        return
    if args.versus:
        print(versus(rows, args.versus, args.length))
        return
    print(per_task(rows) if args.tasks_table else costs(rows) if args.costs else averages(rows))


if __name__ == "__main__":
    main()
