"""codeckv inspect: one tier's K/V heatmaps, DCT spectra and per-layer errors."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from codeckv.cli.common import add_prompt_arguments, file_stem, load, prompt_of, write_figures
from codeckv.cli.types import count, tier_name

NAME = "inspect"
HELP = "one tier's K/V heatmaps, DCT spectra and per-layer errors"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_prompt_arguments(parser, "the first 128 corpus tokens")
    parser.add_argument("--tier", default="jpeg-k2", type=tier_name, help="tier name (default jpeg-k2)")
    parser.add_argument("--layer", type=count, default=0, help="layer of the heatmaps (default 0)")
    parser.add_argument("--head", type=count, default=0, help="KV head of the heatmaps (default 0)")
    parser.add_argument("--out", help="output folder (default out/inspect-<model>-<tier>)")


def run(args: argparse.Namespace) -> None:
    from codeckv.measure.inspection import capture_kv, inspect_capture
    from codeckv.measure.table import format_table, write_csv, write_json
    from codeckv.tiers import get_tier

    tier = get_tier(args.tier)
    loaded = load(args)
    prompt = prompt_of(args, loaded, default_context=128)
    with tqdm(total=2, desc="inspect") as bar:
        capture = capture_kv(loaded, prompt)
        bar.update()
        view = inspect_capture(capture, tier, args.layer, args.head)
        bar.update()
    rows = [asdict(e) for e in view.layers]
    print(format_table(rows, [c for c in rows[0] if c != "layer_type"]))
    print(f"{view.tier}: {len(view.tokens)} tokens, archived {view.head.archived[0]}..{view.head.archived[1] - 1}; "
          f"DCT r={view.spectrum.block_size}, energy kept at k={view.spectrum.k}: "
          f"K {float(view.spectrum.key_kept.mean()):.1%}, V {float(view.spectrum.value_kept.mean()):.1%}")
    out = Path(args.out or f"out/inspect-{file_stem(loaded.info.name)}-{view.tier}")
    write_csv(rows, out / "layers.csv")
    write_json({"model": loaded.info.name, **view.summary()}, out / "inspect.json")
    paths = write_figures(lambda figures: figures.inspect_figures(view), out)
    print(f"wrote {out / 'layers.csv'}, {out / 'inspect.json'}, " + ", ".join(str(p) for p in paths))
