"""codeckv allocate: per-layer tiers under a budget from each layer's measured sensitivity, then the plan against
the uniform budget tier on the corpus and the docstrings."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from codeckv.cli.common import file_stem, forward_bar, load, set_threads
from codeckv.cli.types import count, positive, tier_name

NAME = "allocate"
HELP = ("per-layer tiers under a budget from each layer's measured sensitivity, then the plan against the uniform "
        "budget tier on corpus and docstrings")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget", default="turbo-4", type=tier_name, help="the budget tier (default turbo-4)")
    parser.add_argument("--ladder", nargs="+", type=tier_name, default=["turbo-3", "turbo-4", "int8"],
                        help="tiers a layer may get (default turbo-3 turbo-4 int8)")
    parser.add_argument("--method", choices=["fisher", "lockstep"], default="fisher",
                        help="fisher: (g . error)^2 from one forward + backward of the calibration windows (default);"
                             " lockstep: the KLD of each layer compressed alone (one cache per layer and tier)")
    parser.add_argument("--windows", type=positive, default=4, help="corpus windows to measure on (default 4)")
    parser.add_argument("--length", type=positive, default=256, help="tokens per window (default 256)")
    parser.add_argument("--threads", type=count, default=0, help="torch threads (default: torch's own choice)")
    parser.add_argument("--eval-windows", type=positive, default=4, help="windows of the comparison (default 4)")
    parser.add_argument("--eval-length", type=positive, default=512, help="tokens per comparison window (512)")
    parser.add_argument("--out", help="folder for sensitivity.csv, allocation.csv, comparison.csv "
                                      "(default out/allocate-<model>-<budget>)")


def run(args: argparse.Namespace) -> None:
    from codeckv.measure.allocation import allocate, compare_allocation, fisher_sensitivity, layer_sensitivity
    from codeckv.measure.quality import as_dicts
    from codeckv.measure.table import format_table, write_csv
    from codeckv.tiers import get_tier

    budget, ladder = get_tier(args.budget), [get_tier(name) for name in args.ladder]
    set_threads(args.threads)
    loaded = load(args)
    start = time.perf_counter()
    if args.method == "lockstep":
        bar, progress = forward_bar("sensitivity")
        sensitivity = layer_sensitivity(loaded, ladder, args.windows, args.length, progress)
        bar.close()
    else:
        sensitivity = fisher_sensitivity(loaded, ladder, args.windows, args.length)
    plan = allocate(sensitivity, budget)
    print(f"{args.method} sensitivity of each of {len(sensitivity.layers)} layers under each of "
          f"{', '.join(t.name for t in sensitivity.ladder)}, {args.windows} x {args.length} corpus tokens, "
          f"{time.perf_counter() - start:.0f} s")
    rows = plan.rows(sensitivity)
    print(format_table(rows))
    print(f"plan: {plan.text}\nmean steady-state ratio {plan.cost:.4f} (budget {budget.name}: {plan.budget_cost:.4f}); "
          f"predicted (sum of layers alone) {plan.predicted:.4g} vs {plan.budget_predicted:.4g} uniform")
    out = Path(args.out or f"out/allocate-{file_stem(loaded.info.name)}-{budget.name}")
    paths = [write_csv(sensitivity.rows(), out / "sensitivity.csv"), write_csv(rows, out / "allocation.csv")]
    bar, progress = forward_bar("compare")
    compared = as_dicts(compare_allocation(loaded, plan, args.eval_windows, args.eval_length, progress))
    bar.close()
    for row in compared:
        row["tier"] = "allocated" if row["tier"] == plan.tier.name else row["tier"]
    columns = ["source", "tier", "ratio_vs_bf16", "steady_state_ratio", "kld", "kld_se", "top1_pct", "top1_se",
               "delta_nll_pct", "delta_nll_se"]
    print(format_table(compared, columns))
    for row in compared:
        row["schedule"] = plan.text if row["tier"] == "allocated" else ""
    paths.append(write_csv(compared, out / "comparison.csv"))
    print("wrote " + ", ".join(map(str, paths)))
