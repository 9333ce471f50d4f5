"""codeckv resume: continuing a conversation from its saved .kvc file against prefilling it again natively."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from codeckv.cli.common import file_stem, load, set_threads, step_bar
from codeckv.cli.types import count, positive, tier_name

NAME = "resume"
HELP = "per tier and context: time to the first new token from a saved file vs a native re-prefill, file size"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--contexts", type=positive, nargs="+", default=[1024, 4096, 8192],
                        help="tokens of the saved conversation (default 1024 4096 8192)")
    parser.add_argument("--tiers", nargs="+", type=tier_name, default=["turbo-4", "pca-8x"],
                        help="codec tier names (default turbo-4 pca-8x)")
    parser.add_argument("--question", type=positive, default=16, help="tokens of the new message (default 16)")
    parser.add_argument("--reps", type=positive, default=3, help="repetitions, medians reported (default 3)")
    parser.add_argument("--threads", type=count, default=0, help="torch threads (default: torch's own choice)")
    parser.add_argument("--files", help="folder for the saved cache files (default out/resume-<model>)")
    parser.add_argument("--out", help="CSV path (default out/resume-<model>.csv)")


def run(args: argparse.Namespace) -> None:
    import torch

    from codeckv.measure.resume import resume_table
    from codeckv.measure.table import format_table, write_csv
    from codeckv.tiers import get_tier

    tiers = [get_tier(name) for name in args.tiers]
    set_threads(args.threads)
    loaded = load(args)
    stem = f"resume-{file_stem(loaded.info.name)}"
    with step_bar(len(tiers) * len(args.contexts), "resume") as progress:
        rows = [asdict(r) for r in resume_table(loaded, tiers, args.contexts, args.question, args.reps,
                                                Path(args.files or f"out/{stem}"), progress)]
    print(format_table(rows, ["tier", "context", "file_bytes", "native_bytes", "read_ms", "rebuild_ms",
                              "first_token_ms", "resume_ms", "recompute_ms", "resume_over_recompute", "attention"]))
    print(f"{loaded.info.device}, {loaded.info.dtype}, {torch.get_num_threads()} threads: medians of {args.reps}; "
          f"a {args.question}-token message after the saved conversation; files read from the page cache")
    print(f"wrote {write_csv(rows, args.out or f'out/{stem}.csv')}")
