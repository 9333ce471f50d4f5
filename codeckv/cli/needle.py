"""codeckv needle: pass-key retrieval per tier and peer over prompt lengths and key depths."""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

from codeckv.cli.common import add_grid_arguments, file_stem, grid_backend, model_context, write_figures
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
    add_grid_arguments(parser)
    parser.add_argument("--out", help="CSV path (default out/needle-<model>.csv), written as each cell finishes")
    parser.add_argument("--charts", help="folder for the heatmap (default out/needle-<model>)")
    parser.add_argument("--update", action="store_true",
                        help="keep the cells of the CSV at --out and measure only the (length, depth) cells it lacks")


def run(args: argparse.Namespace) -> None:
    from codeckv.grid import run_grid
    from codeckv.measure.needle import check_lengths, needle_result, needle_row
    from codeckv.measure.needle_job import NeedleJob
    from codeckv.measure.peers import absent_reason, run_for
    from codeckv.measure.table import format_table
    from codeckv.tiers import Tier

    tiers = [run_for(name) for name in args.tiers]
    absent = [reason for t in tiers if not isinstance(t, Tier) and (reason := absent_reason(t))]
    model, context = model_context(args)
    check_lengths(model, context, args.lengths)  # before the model loads
    job = NeedleJob(model, [t.name for t in tiers if isinstance(t, Tier) or not absent_reason(t)], args.lengths,
                    args.depths, args.press_mode)
    out = Path(args.out or f"out/needle-{file_stem(model)}.csv")
    start = time.perf_counter()
    measured = [needle_row(row) for row in run_grid(job, out, grid_backend(args), args.update)]
    if not measured:
        print("nothing measured")
        return
    names = set(row.tier for row in measured)  # native, the tiers asked, then llama.cpp's f16 (its reference)
    order = [n for n in dict.fromkeys(["native", *job.tiers]) if n in names]
    grid = needle_result(measured, order + sorted(names - set(order)),
                         sorted({row.length for row in measured}), sorted({row.depth for row in measured}), absent)
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
    paths = write_figures(lambda figures: {"needle": figures.plots.needle_figure(grid)},
                          Path(args.charts or f"out/needle-{file_stem(model)}"))
    print(f"wrote {out}, " + ", ".join(str(p) for p in paths))
