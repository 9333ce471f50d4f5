"""Command line: python -m codeckv quality|sweep|inspect ... (tables on stdout, CSV/JSON/HTML files)."""

from __future__ import annotations

import argparse
import os
import sys

from tqdm import tqdm


def _quality(args: argparse.Namespace) -> None:
    from codeckv.measure.quality import as_dicts, quality_table
    from codeckv.measure.table import format_table, write_csv
    from codeckv.models import load_model
    from codeckv.tiers import TIERS

    loaded = load_model(args.model)
    tiers = args.tiers or list(TIERS)
    bar = tqdm(total=len(tiers) * args.windows + (0 if "native" in tiers else args.windows), desc="quality")

    def progress(message: str) -> None:
        bar.set_postfix_str(message)
        bar.update(1)

    rows = as_dicts(quality_table(loaded, tiers, args.windows, args.length, progress))
    bar.close()
    columns = ["tier", "archive_bytes", "bf16_bytes", "ratio_vs_bf16", "nll", "delta_nll_pct"]
    print(format_table(rows, columns))
    out = args.out or f"assets/quality-{loaded.info.name.replace('/', '_')}.csv"
    print(f"wrote {write_csv(rows, out)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m codeckv", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    quality = sub.add_parser("quality", help="per tier: archive bytes vs bf16, decode NLL, ΔNLL% on the corpus")
    quality.add_argument("--model", default=None, help="smollm2-135m (default), gemma3-270m or a hub id")
    quality.add_argument("--windows", type=int, default=4, help="corpus windows (default 4)")
    quality.add_argument("--length", type=int, default=512, help="tokens per window (default 512)")
    quality.add_argument("--tiers", nargs="*", help="tier names (default: all)")
    quality.add_argument("--out", help="CSV path (default assets/quality-<model>.csv)")
    quality.set_defaults(run=_quality)

    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        args.run(args)
    except (ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
