"""codeckv saved-size: per tier, bytes at rest, the view's rebuild time, and the saved file against the archive."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from codeckv.cli.common import file_stem, load, set_threads, step_bar
from codeckv.cli.types import count, positive, tier_name

NAME = "saved-size"
HELP = "per tier: bytes at rest, view rebuild time, saved file vs archive"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--context", type=positive, default=2048, help="prefilled corpus tokens (default 2048)")
    parser.add_argument("--tiers", nargs="*", type=tier_name, help="tier names (default: every codec tier)")
    parser.add_argument("--threads", type=count, default=0, help="torch threads (default: torch's own choice)")
    parser.add_argument("--files", help="folder for the saved cache files (default out/saved-size-<model>)")
    parser.add_argument("--out", help="CSV path (default out/saved-size-<model>.csv)")


def run(args: argparse.Namespace) -> None:
    import torch

    from codeckv.measure.saved_size import saved_size_table
    from codeckv.measure.table import format_table, write_csv
    from codeckv.tiers import TIERS, get_tier

    tiers = [get_tier(name) for name in args.tiers] if args.tiers else [t for t in TIERS.values() if not t.is_native]
    set_threads(args.threads)
    loaded = load(args)
    stem = f"saved-size-{file_stem(loaded.info.name)}"
    with step_bar(len(tiers), "saved-size") as progress:
        rows = [asdict(r) for r in saved_size_table(loaded, tiers, args.context, Path(args.files or f"out/{stem}"),
                                                    progress=progress)]
    print(format_table(rows, ["tier", "tokens", "native_bytes", "view_held_bytes", "rest_held_bytes",
                              "rest_over_native", "restore_ms", "file_bytes", "overhead_bytes", "file_over_archive",
                              "within_target", "load_ms", "resume_exact"]))
    print(f"{loaded.info.device}, {loaded.info.dtype}, {torch.get_num_threads()} threads: a {args.context}-token "
          "corpus prompt + 8 teacher-forced tokens; restore_ms median of 3; target file <= archive x 1.01 + 4 KiB")
    print(f"wrote {write_csv(rows, args.out or f'out/{stem}.csv')}")
