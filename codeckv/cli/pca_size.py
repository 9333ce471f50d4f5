"""codeckv pca-size: the PCA tiers' bytes against bf16 and their budget, on texts far from the calibration."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from codeckv.cli.common import file_stem, load, step_bar
from codeckv.cli.types import positive, tier_name

NAME = "pca-size"
HELP = "PCA tiers: bytes vs bf16 and their budget on texts far from calibration"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tiers", nargs="+", type=tier_name, default=["pca-5x", "pca-8x", "pca-16x", "pca-32x"],
                        help="PCA tier names (default pca-8x pca-16x pca-32x)")
    parser.add_argument("--texts", nargs="+", default=None,
                        help="corpus docstrings code numbers multilingual repeated (default: all)")
    parser.add_argument("--length", type=positive, default=512, help="tokens per text (default 512)")
    parser.add_argument("--prefill", type=positive, default=384, help="tokens in the first forward (default 384)")
    parser.add_argument("--out", help="CSV path (default out/pca-size-<model>.csv)")


def run(args: argparse.Namespace) -> None:
    from codeckv.measure.pca_size import SIZE_TEXTS, pca_size_table
    from codeckv.measure.table import format_table, write_csv
    from codeckv.tiers import get_tier

    tiers = [get_tier(name) for name in args.tiers]
    loaded = load(args)
    with step_bar(len(tiers) * len(args.texts or SIZE_TEXTS), "pca-size") as progress:
        rows = [asdict(r) for r in pca_size_table(loaded, tiers, args.texts, args.length, args.prefill, progress)]
    print(format_table(rows, ["tier", "text", "tokens", "archived_tokens", "archive_pct", "chunks_pct", "budget_pct",
                              "worst_boundary_pct", "worst_layer_pct", "mean_step", "skipped_pct"]))
    print(f"{args.prefill} tokens prefilled, then one at a time up to {args.length}; worst_boundary_pct: the "
          "largest running share of all layers together at a chunk boundary once the sinks are paid back "
          "(worst_layer_pct: of one layer, which keeps its own share of the budget)")
    print(f"wrote {write_csv(rows, args.out or f'out/pca-size-{file_stem(loaded.info.name)}.csv')}")
