"""codeckv memory: held, peak and at-rest bytes of each tier beside native over contexts, one process per row."""

from __future__ import annotations

import argparse
from pathlib import Path

from tqdm import tqdm

from codeckv.cli.common import file_stem, model_context, write_figures
from codeckv.cli.types import positive, tier_name

NAME = "memory"
HELP = "held, peak and at-rest bytes of each tier vs native over contexts"
ALL = "all"  # --tiers all: every preset tier
MODES = ("codes", "view")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--contexts", type=positive, nargs="+", default=[1024, 2048, 4096, 8192, 16384],
                        help="prompt tokens (default 1024 2048 4096 8192 16384)")
    parser.add_argument("--new-tokens", type=positive, default=64, help="greedy tokens after the prompt (default 64)")
    parser.add_argument("--tiers", nargs="+", type=tier_or_all, default=["int8", "turbo-4", "pca-8x"],
                        help="tier names, or all (every preset); native always runs (default int8 turbo-4 pca-8x)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                        help="how a codec tier's attention reads: on its codes, through a decoded view, or both "
                             "(default both; a tier without a kernel for its codes runs the view only)")
    parser.add_argument("--out", help="CSV path (default out/memory-<model>.csv)")
    parser.add_argument("--charts", help="folder for the charts (default out/memory-<model>)")


def tier_or_all(text: str) -> str:
    """A preset tier name, or "all" (argparse type)."""
    return text if text == ALL else tier_name(text)


def _chosen(modes: list[str], asked: list[str]) -> list[str]:
    """The asked modes a tier runs in; a tier with none of them (native; codes asked where no kernel reads them)
    runs in its own last mode, so every tier gets a row."""
    return [mode for mode in modes if mode in asked] or modes[-1:]


def run(args: argparse.Namespace) -> None:
    from codeckv.measure.memory import beside_native, memory_row_isolated, modes_of
    from codeckv.measure.table import format_table, write_csv
    from codeckv.tiers import TIERS, get_tier

    model_context(args)  # a model that cannot load is refused here, from its config, before a row's process starts
    names = [name for name in args.tiers if name != ALL] + (list(TIERS) if ALL in args.tiers else [])
    tiers = [get_tier(name) for name in dict.fromkeys(["native", *names])]
    plan = [(t, m, c) for c in args.contexts for t in tiers for m in _chosen(modes_of(t), args.modes)]
    rows = []
    with tqdm(total=len(plan), desc="memory", unit="turn") as bar:
        for tier, mode, context in plan:
            bar.set_postfix_str(f"{tier.name} ({mode}) at {context:,} tokens")  # the turn running now
            rows.append(memory_row_isolated(args.model, tier, mode, context, args.new_tokens))
            bar.update(1)
    table = beside_native(rows)
    mib = [{**r, **{k: r[k] / 2**20 for k in ("held_bytes", "peak_held_bytes", "at_rest_bytes", "process_peak_bytes")}}
           for r in table]
    print(format_table(mib, ["context", "tier", "mode", "raw_until", "archived_tokens", "held_bytes", "held_vs_native",
                             "peak_held_bytes", "at_rest_bytes", "process_peak_bytes", "process_peak_saving_of_native",
                             "seconds"]))
    print(f"MiB; one fresh process per row; {rows[0].process_peak_source}; {args.new_tokens} new tokens per turn")
    stem = f"memory-{file_stem(args.model or 'smollm2-135m')}"
    paths = write_figures(lambda figures: {
        "memory-held": figures.plots.memory_figure(table),
        "memory-process-peak": figures.plots.memory_figure(table, "process_peak_bytes",
                                                           "Process peak over the turn vs context"),
    }, Path(args.charts or f"out/{stem}"))
    print(f"wrote {write_csv(table, args.out or f'out/{stem}.csv')}, " + ", ".join(str(p) for p in paths))
