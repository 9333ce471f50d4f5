"""How long a tier takes to build its cache from a native one (CodecCache.from_cache): what the RULER grid pays per
tier and sample after the shared prefill, timed alone.

    .venv/bin/python scripts/conversion_time.py --model qwen2.5-coder-0.5b --tokens 4096 --tiers pca-5x int8 --threads 2

One native prefill of `tokens` corpus tokens (timed too, for the ratio), then each tier's conversion of that cache,
a warm-up and `--reps` timed runs (medians). The calibration is read before the timings, as the grid reads it once.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

from codeckv.cache import CodecCache
from codeckv.cache.calibration import calibration_for
from codeckv.corpus import corpus_windows
from codeckv.models import load_model
from codeckv.tiers import get_tier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model name (default: the embedded default)")
    parser.add_argument("--tokens", type=int, default=4096, help="context tokens (default 4096)")
    parser.add_argument("--tiers", nargs="+", default=["pca-5x"], help="tiers to convert to (default pca-5x)")
    parser.add_argument("--reps", type=int, default=3, help="timed conversions per tier (default 3)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model) if args.model else load_model()
    tiers = [get_tier(name) for name in args.tiers]
    calibrations = {tier.name: calibration_for(loaded, tier) for tier in tiers}
    ids = corpus_windows(loaded.tokenizer, 1, args.tokens)
    native = DynamicCache(config=loaded.model.config)
    start = time.perf_counter()
    with torch.inference_mode():
        loaded.model(ids, cache=native)
    prefill = time.perf_counter() - start
    threads = torch.get_num_threads()
    print(f"{loaded.info.name}, {args.tokens} tokens, {threads} threads: native prefill {prefill:.1f} s")
    print("| tier | conversion, median (s) | runs (s) | share of the prefill |\n|---|---:|---|---:|")
    for tier in tiers:
        with torch.inference_mode():
            CodecCache.from_cache(native, tier, None, calibrations[tier.name])  # warm-up: lazily built tables
            runs = []
            for _ in range(args.reps):
                start = time.perf_counter()
                CodecCache.from_cache(native, tier, None, calibrations[tier.name])
                runs.append(time.perf_counter() - start)
        median = statistics.median(runs)
        print(f"| {tier.name} | {median:.2f} | {', '.join(f'{r:.2f}' for r in runs)} | {median / prefill:.1%} |")


if __name__ == "__main__":
    main()
