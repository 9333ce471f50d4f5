"""A chart the CLI wrote (standalone HTML, plotly.js embedded), or the Pareto chart of a quality CSV, as a PNG shot
with headless Debian Chromium.

    PYTHONPATH=. .venv/bin/python scripts/chart_png.py out/quality-smollm2-135m/pareto_kld.html out/pareto.png
    PYTHONPATH=. .venv/bin/python scripts/chart_png.py assets/quality-smollm2-135m.csv \
        assets/screenshots/pareto-smollm2-135m.png --with assets/quality-smollm2-135m-presses.csv

A CSV (written by `python -m codeckv quality --out assets/quality-<model>[-<source>].csv`) is drawn as the quality
command draws its storage-vs-KLD chart (codeckv.figures.plots.pareto_figure), titled with the model its name gives;
`--with` adds the rows of other CSVs of the same model and text (the presses' rows, measured on 1,024-token contexts
pressed once: the title says so), native's row taken from the first.

Fails (exit 1, the PNG still written) when the drawn figure has a layout problem a reader would trip on: a label
cut off at the edge, two labels on top of each other (tests/figure_layout.py, the browser tests' check).
Chromium and playwright come with `scripts/setup.sh --dev`.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from codeckv.figures.plots import pareto_figure
from codeckv.measure.table import numbers
from tests.figure_layout import CHROMIUM, FLAGS, figure_layout_problems


def pareto_html(table: Path, out: Path, others: list[Path] = ()) -> Path:
    """The storage-vs-KLD chart of a quality CSV (and the rows of `others` but their native) as standalone HTML at
    `out`, its title naming the model, the text and each protocol."""
    rows = [numbers(row) for row in csv.DictReader(table.open(newline=""))]
    first = rows[0]
    model = table.stem.removeprefix("quality-").removesuffix(f"-{first['source']}")
    where = f"{int(first['windows'])} × {int(first['tokens_per_window'])} tokens of {first['source']}"
    for other in others:
        more = [numbers(row) for row in csv.DictReader(other.open(newline="")) if row["tier"] != "native"]
        if more:
            prefix = int(more[0].get("prefix_tokens") or 0)
            where += f"; presses: {prefix:,}-token contexts pressed {more[0].get('press_mode') or 'once'}"
            rows += more
    pareto_figure(rows, "kld", title=f"{model}: storage vs KL divergence ({where})").write_html(
        out, include_plotlyjs=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chart", type=Path, help="a chart the CLI wrote (.html) or a quality CSV (.csv)")
    parser.add_argument("png", type=Path, help="where the screenshot goes")
    parser.add_argument("--with", dest="others", type=Path, nargs="*", default=[],
                        help="more quality CSVs of the same model and text whose rows join the chart")
    parser.add_argument("--width", type=int, default=1400, help="viewport width in pixels (default 1400)")
    parser.add_argument("--height", type=int, default=900, help="viewport height in pixels (default 900)")
    args = parser.parse_args()
    if not args.chart.is_file():
        parser.error(f"{args.chart}: no such file")
    html = args.chart
    if args.chart.suffix == ".csv":
        html = pareto_html(args.chart, Path(tempfile.mkdtemp()) / "pareto_kld.html", args.others)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": args.width, "height": args.height})
        page.goto(html.resolve().as_uri())
        page.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=60_000)
        args.png.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(args.png), full_page=True)
        problems = figure_layout_problems(page)
        browser.close()
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"wrote {args.png}" + (f" ({len(problems)} layout problems)" if problems else ", no layout problem"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
