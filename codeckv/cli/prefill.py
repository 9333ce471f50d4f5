"""codeckv prefill: prefill + archiving the prompt against native prefill, per tier (interleaved, medians)."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from codeckv.cli.common import file_stem, load, set_threads, step_bar
from codeckv.cli.types import count, positive, tier_name

NAME = "prefill"
HELP = "prefill + archiving the prompt vs native prefill, per tier (interleaved)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=positive, nargs="+", default=[1024, 4096], help="prompt lengths (1024 4096)")
    parser.add_argument("--tiers", nargs="*", type=tier_name, help="tier names (default: all)")
    parser.add_argument("--reps", type=positive, default=3, help="repetitions, medians reported (default 3)")
    parser.add_argument("--threads", type=count, default=0, help="torch threads (default: torch's own choice)")
    parser.add_argument("--no-convert", action="store_true", help="skip native prefill + CodecCache.from_cache")
    parser.add_argument("--out", help="CSV path (default out/prefill-<model>.csv)")


def run(args: argparse.Namespace) -> None:
    import torch

    from codeckv.measure.prefill import prefill_table
    from codeckv.measure.table import format_table, write_csv
    from codeckv.tiers import TIERS, get_tier

    tiers = [get_tier(name) for name in args.tiers] if args.tiers else list(TIERS.values())
    set_threads(args.threads)
    loaded = load(args)
    total = len(args.tokens) * args.reps * sum(not t.is_native for t in tiers)
    with step_bar(total, "prefill") as progress:
        rows = [asdict(r) for r in prefill_table(loaded, tiers, args.tokens, args.reps, not args.no_convert, progress)]
    print(format_table(rows, ["tokens", "tier", "native_s", "prefill_s", "ratio", "convert_s", "convert_ratio"]))
    print(f"{loaded.info.device}, {loaded.info.dtype}, {torch.get_num_threads()} threads, median of {args.reps}")
    print(f"wrote {write_csv(rows, args.out or f'out/prefill-{file_stem(loaded.info.name)}.csv')}")
