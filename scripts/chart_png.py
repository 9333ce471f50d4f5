"""A chart the CLI wrote (standalone HTML, plotly.js embedded) as a PNG, shot with headless Debian Chromium.

    PYTHONPATH=. .venv/bin/python scripts/chart_png.py out/quality-smollm2-135m/pareto_kld.html \
        assets/screenshots/pareto-smollm2-135m.png

Fails (exit 1, the PNG still written) when the drawn figure has a layout problem a reader would trip on: a label
cut off at the edge, two labels on top of each other (tests/figure_layout.py, the browser tests' check).
Chromium and playwright come with `scripts/setup.sh --dev`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

from tests.figure_layout import CHROMIUM, FLAGS, figure_layout_problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html", type=Path, help="a chart the CLI wrote")
    parser.add_argument("png", type=Path, help="where the screenshot goes")
    parser.add_argument("--width", type=int, default=1400, help="viewport width in pixels (default 1400)")
    parser.add_argument("--height", type=int, default=900, help="viewport height in pixels (default 900)")
    args = parser.parse_args()
    if not args.html.is_file():
        parser.error(f"{args.html}: no such file")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        page = browser.new_page(viewport={"width": args.width, "height": args.height})
        page.goto(args.html.resolve().as_uri())
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
