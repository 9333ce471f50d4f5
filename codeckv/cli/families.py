"""codeckv families: which transformers model families each tier runs on, on a decoded view and on the codes."""

from __future__ import annotations

import argparse

from codeckv.cli.common import step_bar
from codeckv.cli.types import tier_name

NAME = "families"
HELP = "every tier on a tiny random-weight model of each transformers family: runs, refused (and why) or failed"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--families", nargs="+", metavar="FAMILY", default=None,
                        help="transformers model types, e.g. llama gemma2 deepseek_v3 (default: every one of "
                             "codeckv/measure/families.py)")
    parser.add_argument("--tiers", nargs="+", type=tier_name, default=None, help="tier names (default: every tier)")
    parser.add_argument("--out", help="CSV path (default out/families.csv)")


def run(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    from codeckv.measure.families import FAMILIES, check_family
    from codeckv.measure.table import write_csv
    from codeckv.tiers import TIERS, get_tier

    tiers = [get_tier(name) for name in (args.tiers or TIERS)]
    args.families = args.families or list(FAMILIES)
    unknown = [f for f in args.families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown families {unknown} (allowed: {', '.join(FAMILIES)})")
    rows = []
    with step_bar(len(args.families), "families", "family") as progress:
        for family in args.families:
            rows += check_family(family, tiers)
            progress(family)
    names = [t.name for t in tiers if not t.is_native]
    letter = {"same tokens": "=", "runs": "+", "refused": "r", "failed": "F"}
    width = max(map(len, args.families))
    print(f"{'family':<{width}}  native  " + "  ".join(f"{name:>12}" for name in names))
    for family in args.families:
        mine = {(r.tier, r.mode): r.outcome for r in rows if r.family == family}
        cells = [f"{letter[mine[name, 'view']]}{letter[mine[name, 'codes']]}".rjust(12) for name in names]
        print(f"{family:<{width}}  {letter[mine['native', 'view']]:>6}  " + "  ".join(cells))
    print("view|codes: = native's greedy tokens, + runs (other tokens), r refused when the cache was made, F failed")
    refused = {(r.family, r.detail) for r in rows if r.outcome == "refused"}
    for family, reason in sorted(refused):
        print(f"  {family}: {reason}")
    failed = [r for r in rows if r.outcome == "failed"]
    for r in failed:
        print(f"  FAILED {r.family} {r.tier} ({r.mode}): {r.detail}")
    print(f"wrote {write_csv([asdict(r) for r in rows], args.out or 'out/families.csv')}")
    if failed:
        raise RuntimeError(f"{len(failed)} family x tier runs failed (listed above)")
