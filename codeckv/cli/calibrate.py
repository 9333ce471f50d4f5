"""codeckv calibrate: compute a model's PCA calibrations on an empty folder, and what that costs (time, files, peak)."""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import asdict
from pathlib import Path

from codeckv.cli.common import file_stem, load

NAME = "calibrate"
HELP = "PCA calibrations from scratch: seconds, file sizes, process peak above the loaded model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--into", help="folder to compute them into (must hold no calibration; default: a temporary "
                                       "one, removed after; the app's own are under $CODECKV_CACHE/calibration)")
    parser.add_argument("--out", help="CSV path (default out/calibration-<model>.csv)")


def run(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    from codeckv.measure.calibration_cost import calibration_cost
    from codeckv.measure.table import format_table, write_csv

    loaded = load(args)
    with tempfile.TemporaryDirectory(prefix="codeckv-calibrate-") as temporary:
        with tqdm(total=100, desc="calibrate", unit="%") as bar:
            def progress(fraction: float, message: str) -> None:
                bar.n = round(100 * fraction)
                bar.set_postfix_str(message, refresh=False)
                bar.refresh()

            rows = [asdict(r) for r in calibration_cost(loaded, Path(args.into or temporary), progress)]
    mib = 2**20
    for row in rows:
        row.update({k.replace("_bytes", "_mib"): round(row[k] / mib, 2) for k in list(row) if k.endswith("_bytes")})
    print(format_table(rows, ["tier", "bits_per_element", "tier_file_mib", "basis_file_mib", "pass_seconds",
                              "model_rss_mib", "peak_rss_mib", "above_model_mib"]))
    print("one pass computes every tier: its seconds and peak are shared; the loaded model has its weights resident")
    print(f"wrote {write_csv(rows, args.out or f'out/calibration-{file_stem(loaded.info.name)}.csv')}")
