"""codeckv latency: decode ms/token of native and the tiers, with and without a decoded view, or (--contexts) on
the stored codes at several corpus lengths."""

from __future__ import annotations

import argparse

from codeckv.cli.common import add_prompt_arguments, file_stem, load, prompt_of, set_threads, step_bar
from codeckv.cli.types import count, positive, run_name, token_counts

NAME = "latency"
HELP = "decode ms/token native vs tiers, with and without a decoded view"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_prompt_arguments(parser, "the first 1024 corpus tokens")
    parser.add_argument("--tokens", type=positive, default=64, help="new tokens per run (default 64)")
    parser.add_argument("--tiers", nargs="+", type=run_name, default=["turbo-4"],
                        help="tier names (default turbo-4); with --contexts also llama.cpp's (llamacpp-q4_0, ...)")
    parser.add_argument("--threads", type=count, default=0, help="torch threads (default: torch's own choice)")
    parser.add_argument("--contexts", type=token_counts, default=None, metavar="N,N,...",
                        help="corpus prefix lengths, e.g. 1024,4096,8192: attention on the codes only (no view), "
                             "every tier against one native cache per length")
    parser.add_argument("--out", help="CSV path (default out/latency-<model>.csv, with --contexts "
                                      "out/latency-codes-<model>.csv)")


def usage_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with a latency command line that argparse cannot see (None: nothing)."""
    if args.contexts and (args.context or args.prompt is not None):
        return "--contexts measures corpus prefixes; it takes no --context or --prompt"
    from codeckv.measure.peers import run_for
    from codeckv.tiers import Tier

    others = [name for name in args.tiers if not isinstance(run_for(name), Tier)]
    if others and not args.contexts:
        return f"{', '.join(others)}: llama.cpp's KV types are timed with --contexts only (transformers peers: never)"
    return None


def run(args: argparse.Namespace) -> None:
    from codeckv.measure.latency import latency_table
    from codeckv.measure.peers import run_for
    from codeckv.measure.table import format_table, write_csv

    tiers = [run_for(name) for name in args.tiers]
    set_threads(args.threads)
    loaded = load(args)
    if args.contexts:
        return _codes_latency(args, loaded, args.contexts, tiers)
    prompt = prompt_of(args, loaded, default_context=1024)
    with step_bar(2 * len(tiers), "latency") as progress:
        rows = latency_table(loaded, prompt, tiers, args.tokens, progress)
    print(format_table(rows, ["tier", "materialization_free", "native_decode_ms", "decode_ms", "latency_ratio",
                              "native_prefill_s", "prefill_s", "token_match", "delta_nll_pct", "ratio_vs_bf16"]))
    print(f"{loaded.info.device}, {loaded.info.dtype}: {rows[0]['prompt_tokens']}-token prompt, "
          f"{rows[0]['new_tokens']} new tokens")
    print(f"wrote {write_csv(rows, args.out or f'out/latency-{file_stem(loaded.info.name)}.csv')}")


def _codes_latency(args: argparse.Namespace, loaded, contexts: list[int], tiers) -> None:
    """latency --contexts: the default path (the stored codes; a short context's view) against native per context."""
    import torch

    from codeckv.measure.latency import WARMUP_STEPS, codes_latency_table, llamacpp_latency_table
    from codeckv.measure.llamacpp import LlamaCppPeer, llamacpp_absent_reason
    from codeckv.measure.peers import Peer
    from codeckv.measure.table import format_table, write_csv
    from codeckv.tiers import Tier

    if any(isinstance(t, Peer) for t in tiers):
        raise ValueError("transformers' QuantizedCache peers are not timed here (allowed: tiers, llama.cpp's types)")
    llama = [t for t in tiers if isinstance(t, LlamaCppPeer)]
    absent = [why for why in (llamacpp_absent_reason(t, loaded.info.name) for t in llama) if why]
    llama = llama if not absent else []
    codecs = [t for t in tiers if isinstance(t, Tier)]
    rows = []
    with step_bar(len(contexts) * len(codecs) + (len(contexts) if llama else 0), "latency (codes)") as progress:
        if codecs:
            rows += codes_latency_table(loaded, contexts, codecs, args.tokens, progress)
        if llama:
            rows += llamacpp_latency_table(loaded, contexts, llama, args.tokens, progress)
    print(format_table(rows, ["tier", "engine", "context", "native_decode_ms", "codes_decode_ms", "latency_ratio",
                              "token_match", "resident_vs_native", "attention"]))
    for why in dict.fromkeys(absent):
        print(why)
    print(f"{loaded.info.device}, {loaded.info.dtype}, {torch.get_num_threads()} threads: make_cache's default "
          f"path (attention: where the last step read), medians of {args.tokens - WARMUP_STEPS} timed greedy steps, "
          "caches in turns, after one native prefill per context")
    print(f"wrote {write_csv(rows, args.out or f'out/latency-codes-{file_stem(loaded.info.name)}.csv')}")
