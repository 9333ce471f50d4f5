"""codeckv needle: pass-key retrieval per tier and peer over prompt lengths and key depths."""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

from codeckv.cli.common import file_stem, forward_bar, load, model_context, write_figures
from codeckv.cli.types import positive, run_name
from codeckv.presses.base import PRESS_MODE_MEANING, PRESS_MODES

NAME = "needle"
HELP = "pass-key retrieval per tier over prompt lengths and key depths"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lengths", type=positive, nargs="+", default=[1024, 2048, 4096, 8000],
                        help="prompt lengths in tokens (default 1024 2048 4096 8000)")
    parser.add_argument("--depths", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0],
                        help="where the key sits in the filler, 0 = start (default 0 0.25 0.5 0.75 1)")
    parser.add_argument("--tiers", nargs="+", type=run_name, default=["turbo-4", "turbo-3", "int8", "jpeg-k2"],
                        help="tier or peer names (default turbo-4 turbo-3 int8 jpeg-k2)")
    parser.add_argument("--press-mode", choices=PRESS_MODES, default="once",
                        help="a press's protocol (default once; the context is all before the question): "
                             + "; ".join(f"{mode} = {meaning}" for mode, meaning in PRESS_MODE_MEANING.items()))
    parser.add_argument("--out", help="CSV path (default out/needle-<model>.csv)")
    parser.add_argument("--charts", help="folder for the heatmap (default out/needle-<model>)")


def run(args: argparse.Namespace) -> None:
    from codeckv.measure.needle import as_dicts, check_lengths, needle_grid
    from codeckv.measure.peers import run_for
    from codeckv.measure.table import format_table, write_csv

    tiers = [run_for(name) for name in args.tiers]
    check_lengths(*model_context(args), args.lengths)  # before the model loads
    loaded = load(args)
    bar, progress = forward_bar("needle", unit="cell")
    start = time.perf_counter()
    grid = needle_grid(loaded, tiers, args.lengths, args.depths, progress, args.press_mode)
    bar.close()
    failed = Counter((r.tier, r.length) for r in grid.rows if r.error)  # cells a peer itself failed on
    summary = [{"tier": tier, **{f"{n} tok": f"{int(grid.retrieved(tier)[:, j].sum())}/{len(grid.depths)}"
                                 + (f" ({failed[tier, n]} failed)" if failed[tier, n] else "")
                                 for j, n in enumerate(grid.lengths)}} for tier in grid.tiers]
    print(format_table(summary))
    for reason in grid.absent:
        print(reason)
    presses = any(row.press_mode for row in grid.rows)
    protocol = f"; presses {args.press_mode}: {PRESS_MODE_MEANING[args.press_mode]}" if presses else ""
    print(f"retrieved / depths {', '.join(f'{d:g}' for d in grid.depths)}{protocol}; "
          f"took {time.perf_counter() - start:.1f} s")
    stem = f"needle-{file_stem(loaded.info.name)}"
    written = write_csv(as_dicts(grid.rows), args.out or f"out/{stem}.csv")  # before the charts, as in quality
    paths = write_figures(lambda figures: {"needle": figures.plots.needle_figure(grid)},
                          Path(args.charts or f"out/{stem}"))
    print(f"wrote {written}, " + ", ".join(str(p) for p in paths))
