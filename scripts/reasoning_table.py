"""The word-problem tables of the README and docs/reasoning.md, from the per-problem CSVs `python -m codeckv
reasoning` writes (assets/reasoning-<model>-problems.csv), and the charts as PNGs.

    PYTHONPATH=. .venv/bin/python scripts/reasoning_table.py assets/reasoning-qwen2.5-coder-0.5b-problems.csv
    PYTHONPATH=. .venv/bin/python scripts/reasoning_table.py assets/reasoning-qwen2.5-coder-0.5b-problems.csv \
        --tiers native int8 turbo-3 --png assets/screenshots/reasoning-qwen2.5-coder-0.5b
    PYTHONPATH=. .venv/bin/python scripts/reasoning_table.py assets/reasoning-qwen2.5-coder-0.5b-problems.csv \
        --groups native int8/fp8-e4m3 turbo-4/turbo-3          # the README's rows: a group's tiers side by side

Rows are compared on the problems every listed tier answered (a CSV grown over several runs may hold more for
some). Prints one Markdown table per tier (accuracy, its difference from the reference paired by problem, agreement,
flips, departure, KLD, top-1, bytes) and native's
accuracy per step count; with --png, the accuracy-vs-bytes chart and the KLD-vs-position curve, shot with headless
Chromium (scripts/chart_png.py), failing on a layout problem.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

from codeckv.measure.reasoning_summary import kld_curve, mean_se, summarize


def _pm(value: float, se: float, digits: int) -> str:
    if math.isnan(value):
        return "–"
    return f"{value:.{digits}f} ± {se:.{digits}f}" if not math.isnan(se) else f"{value:.{digits}f}"


def _kld(value: float, se: float) -> str:
    if math.isnan(value):
        return "–"
    digits = max(1, 2 - math.floor(math.log10(value))) if value > 0 else 1
    return _pm(value, se, digits) if value > 0 else "0"


def common_problems(rows: list[dict], tiers: list[str]) -> list[dict]:
    """The rows of `tiers` (and their references) on the problems all of them answered."""
    wanted = set(tiers) | {r["reference"] for r in rows if r["tier"] in tiers}
    by_tier: dict[str, set[int]] = {}
    for row in rows:
        by_tier.setdefault(row["tier"], set()).add(int(row["index"]))
    shared = set.intersection(*(by_tier.get(t, set()) for t in wanted))
    return [r for r in rows if r["tier"] in wanted and int(r["index"]) in shared]


def paired(lost: int, gained: int, problems: int) -> tuple[float, float]:
    """A tier's accuracy minus its reference's in points, ± its standard error, paired problem by problem: each
    problem differs by +100 (gained), -100 (lost) or 0."""
    return mean_se([100.0] * gained + [-100.0] * lost + [0.0] * (problems - gained - lost))


def markdown(rows: list[dict], tiers: list[str]) -> str:
    summary = {s["tier"]: s for s in summarize(rows)}
    lines = ["| cache | stores (vs bf16, end of reply) | accuracy % | vs its reference (paired) | agreement % | "
             "lost / gained | departed % (median position) | KLD along its reply | top-1 % |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for tier in tiers:
        s = summary[tier]
        departure = f"{s['departed']:.0f}" + (f" ({s['first_departure']:.0f})" if s["departed"] else "")
        diff, se = paired(s["lost"], s["gained"], s["problems"])
        apart = "" if math.isnan(se) or abs(diff) <= 2 * se else " *"
        lines.append(f"| `{tier}` | {100 * s['stored_vs_bf16']:.1f}% | {_pm(s['accuracy'], s['accuracy_se'], 1)} | "
                     f"{_pm(diff, se, 1)}{apart} | {s['agreement']:.1f} | {s['lost']} / {s['gained']} | "
                     f"{departure} | {_kld(s['kld'], s['kld_se'])} | {_pm(s['top1'], s['top1_se'], 1)} |")
    problems = min(s["problems"] for s in summary.values())
    return "\n".join(lines) + f"\n\n{problems} problems each; * told apart from its reference (beyond twice the error)"


def grouped(rows: list[dict], groups: list[list[str]]) -> str:
    """The README's table: a row per group of tiers, their figures side by side ("a / b")."""
    summary = {s["tier"]: s for s in summarize(rows)}

    def joined(group: list[str], show) -> str:
        return " / ".join(show(summary[t]) for t in group)

    lines = ["| cache | stores (vs bf16) | accuracy % (± se) | lost / gained | departed % | KLD along its reply |",
             "|---|---:|---:|---:|---:|---:|"]
    for group in groups:
        lines.append("| " + " / ".join(f"`{t}`" for t in group) + " | "
                     + joined(group, lambda s: f"{100 * s['stored_vs_bf16']:.1f}%") + " | "
                     + joined(group, lambda s: _pm(s["accuracy"], s["accuracy_se"], 1)) + " | "
                     + joined(group, lambda s: f"{s['lost']}/{s['gained']}") + " | "
                     + joined(group, lambda s: f"{s['departed']:.0f}") + " | "
                     + joined(group, lambda s: _kld(s["kld"], math.nan)) + " |")
    problems = min(s["problems"] for s in summary.values())
    return "\n".join(lines) + f"\n\n{problems} problems each"


def by_steps(rows: list[dict], tier: str = "native") -> str:
    """`tier`'s accuracy (lm-eval strict) and reply length per step count."""
    lines = [f"| steps | problems | {tier} accuracy % | reply tokens |", "|---:|---:|---:|---:|"]
    for steps in sorted({int(r["steps"]) for r in rows}):
        mine = [r for r in rows if r["tier"] == tier and int(r["steps"]) == steps]
        accuracy, se = mean_se([100.0 * float(r["correct"]) for r in mine])
        tokens, _ = mean_se([float(r["answer_tokens"]) for r in mine])
        lines.append(f"| {steps} | {len(mine)} | {_pm(accuracy, se, 1)} | {tokens:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("problems", type=Path, help="a -problems.csv of python -m codeckv reasoning")
    parser.add_argument("--tiers", nargs="+", help="rows, in this order (default: every tier, as met)")
    parser.add_argument("--groups", nargs="+", help="the README's rows instead: tiers joined by '/' share a row")
    parser.add_argument("--png", type=Path, help="write <stem>-accuracy.png and <stem>-kld.png")
    args = parser.parse_args(argv)
    rows = list(csv.DictReader(args.problems.open(newline="")))
    groups = [group.split("/") for group in args.groups] if args.groups else None
    every = list(dict.fromkeys(r["tier"] for r in rows))
    tiers = [t for group in groups for t in group] if groups else args.tiers or every
    unknown = set(tiers) - {r["tier"] for r in rows}
    if unknown:
        sys.exit(f"{args.problems} has no rows of {', '.join(sorted(unknown))}")
    rows = common_problems(rows, tiers)
    print(grouped(rows, groups) if groups else markdown(rows, tiers))
    print()
    print(by_steps(rows))
    if args.png:
        write_pngs(rows, tiers, args.problems, args.png)


def write_pngs(rows: list[dict], tiers: list[str], source: Path, stem: Path) -> None:
    import tempfile

    from playwright.sync_api import sync_playwright

    from codeckv.figures import reasoning_accuracy_figure, reasoning_curve_figure
    from tests.figure_layout import CHROMIUM, FLAGS, figure_layout_problems

    model = source.stem.removeprefix("reasoning-").removesuffix("-problems")
    figures = {"accuracy": reasoning_accuracy_figure([s for s in summarize(rows) if s["tier"] in tiers], model),
               "kld": reasoning_curve_figure([c for c in kld_curve(rows) if c["tier"] in tiers], model)}
    problems = []
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1200, "height": 700})
        for name, fig in figures.items():
            html = Path(tmp) / f"{name}.html"
            fig.write_html(html, include_plotlyjs=True)
            page.goto(html.as_uri())
            page.wait_for_selector(".js-plotly-plot")
            page.wait_for_timeout(500)
            out = stem.with_name(f"{stem.name}-{name}.png")
            page.screenshot(path=str(out), full_page=True)
            problems += [f"{out.name}: {problem}" for problem in figure_layout_problems(page)]
            print(f"wrote {out}")
        browser.close()
    if problems:
        sys.exit("layout problems: " + "; ".join(problems))


if __name__ == "__main__":
    main()
