"""codeckv sweep: per tier on one prompt (one sample): bytes, decode latency, token match, KLD."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from codeckv.cli.common import add_prompt_arguments, file_stem, forward_bar, load, prompt_of, write_figures
from codeckv.cli.types import positive, tier_name

NAME = "sweep"
HELP = "per tier on one prompt (one sample): bytes, latency, token match, KLD"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_prompt_arguments(parser, "a question about KV caches")
    parser.add_argument("--tokens", type=positive, default=64, help="new tokens per run (default 64)")
    parser.add_argument("--tiers", nargs="*", type=tier_name, help="tier names (default: all)")
    parser.add_argument("--no-stop", action="store_true", help="ignore EOS: always generate --tokens tokens")
    parser.add_argument("--out", help="output folder (default out/sweep-<model>; charts embed plotly.js)")


def run(args: argparse.Namespace) -> None:
    from codeckv.measure.sweep import as_dicts, sweep
    from codeckv.measure.table import format_table, write_csv, write_json
    from codeckv.tiers import TIERS, get_tier

    tiers = [get_tier(name) for name in args.tiers] if args.tiers else list(TIERS.values())
    loaded = load(args)
    prompt = prompt_of(args, loaded)
    bar, progress = forward_bar("sweep")
    start = time.perf_counter()
    result = sweep(loaded, prompt, tiers, args.tokens, not args.no_stop, progress)
    seconds = time.perf_counter() - start
    bar.close()
    rows = as_dicts(result.rows)
    columns = ["tier", "archive_bytes", "ratio_vs_bf16", "kld", "top1_pct", "delta_nll_pct", "decode_ms",
               "latency_ratio", "token_match", "first_divergence", "psnr_db"]
    print(format_table(rows, columns))
    print(f"native: {len(result.native.token_ids)} new tokens after a {result.prompt_tokens}-token prompt, "
          f"{result.native.decode_ms:.1f} ms/token; sweep took {seconds:.1f} s")
    out = Path(args.out or f"out/sweep-{file_stem(loaded.info.name)}")
    write_csv(rows, out / "sweep.csv")
    write_json({
        "model": loaded.info.name, "device": loaded.info.device, "dtype": loaded.info.dtype,
        "prompt_tokens": result.prompt_tokens, "max_new_tokens": args.tokens, "seconds": seconds,
        "native_text": result.native.text, "rows": rows,
        "runs": {label: {**c.summary(), "text": c.codec.text, "token_kld": c.token_kld,
                         "token_nll_native": c.token_nll_native, "token_nll_codec": c.token_nll_codec}
                 for label, c in result.comparisons.items()},
    }, out / "sweep.json")
    paths = write_figures(lambda figures: figures.sweep_figures(result), out)
    print(f"wrote {out / 'sweep.csv'}, {out / 'sweep.json'}, " + ", ".join(str(p) for p in paths))
