"""Command line: codeckv quality|sweep|needle|inspect|memory|prefill|latency|saved-size|pca-size|allocate
(python -m codeckv)

Tables on stdout, progress bars on stderr; CSV, JSON and HTML files under out/ unless --out / --charts
say where (the README's commands that regenerate the committed CSVs pass --out assets/...).
The hub is used as huggingface_hub is told: `--offline` (or HF_HUB_OFFLINE=1) keeps a run off the
network; otherwise a hub id downloads once into the HF cache. Exit status: 0 done, 1 a runtime
error (one line on stderr), 2 a usage error (argparse), 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from codeckv import __version__
from codeckv.cli_types import bits_list, count, positive, run_name, tier_name, token_counts

DEFAULT_PROMPT = "Explain in a few sentences how a key-value cache speeds up text generation in a transformer."


def _bar(desc: str, unit: str = "fwd"):
    """A tqdm bar and the (done, total, message) progress callback that drives it."""
    bar = tqdm(total=1, desc=desc, unit=unit)

    def progress(done: int, total: int, message: str) -> None:
        bar.total = total
        bar.n = done
        bar.set_postfix_str(message, refresh=False)
        bar.refresh()

    return bar, progress


def _load(args: argparse.Namespace):
    """Load --model (the embedded default when unset), saying so on stderr: a first load converts or downloads."""
    from codeckv.models import DEFAULT_MODEL, load_model

    print(f"loading {args.model or DEFAULT_MODEL} ...", file=sys.stderr, flush=True)
    return load_model(args.model)


def _quality(args: argparse.Namespace) -> None:
    from codeckv.measure.quality import as_dicts, measure_quality
    from codeckv.measure.table import format_table, write_csv
    from codeckv.peers import PEERS, run_for
    from codeckv.tiers import TIERS, pca_tier

    tiers = [run_for(name) for name in args.tiers or [*TIERS, *PEERS]]
    tiers += [pca_tier(bits) for bits in args.pca_bits]
    text = Path(args.text_file).read_text(encoding="utf-8") if args.text_file else None
    loaded = _load(args)
    bar, progress = _bar("quality")
    start = time.perf_counter()
    run = measure_quality(loaded, tiers, args.windows, args.length, args.source, text, progress)
    bar.close()
    rows = as_dicts(run.rows)
    columns = ["tier", "ratio_vs_bf16", "steady_state_ratio", "held_bytes", "kld", "kld_se", "top1_pct", "top1_se",
               "delta_nll_pct", "delta_nll_se", "nll", "entropy_coded_bytes"]
    print(format_table(rows, columns))
    for reason in run.absent:
        print(reason)
    where = "a text file" if text is not None else f"the {args.source}"
    print(f"{args.windows} windows x {args.length} tokens of {where}, {run.reference.positions} scored positions "
          f"each; took {time.perf_counter() - start:.1f} s")
    name = loaded.info.name.replace("/", "_")
    suffix = "" if text is None and args.source == "corpus" else f"-{'text' if text is not None else args.source}"
    out = args.out or f"out/quality-{name}{suffix}.csv"
    charts = Path(args.charts or f"out/quality-{name}{suffix}")
    written = write_csv(rows, out)  # before the charts: a long run's numbers never hang on the optional figures
    paths = _write_figures(lambda figures: figures.quality_figures(run), charts)
    print(f"wrote {written}, " + ", ".join(str(p) for p in paths))


def _allocate(args: argparse.Namespace) -> None:
    from codeckv.measure.allocation import allocate, compare_allocation, fisher_sensitivity, layer_sensitivity
    from codeckv.measure.quality import as_dicts
    from codeckv.measure.table import format_table, write_csv

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    loaded = _load(args)
    start = time.perf_counter()
    if args.method == "lockstep":
        bar, progress = _bar("sensitivity")
        sensitivity = layer_sensitivity(loaded, args.ladder, args.windows, args.length, progress)
        bar.close()
    else:
        sensitivity = fisher_sensitivity(loaded, args.ladder, args.windows, args.length)
    plan = allocate(sensitivity, args.budget)
    print(f"{args.method} sensitivity of each of {len(sensitivity.layers)} layers under each of "
          f"{', '.join(t.name for t in sensitivity.ladder)}, {args.windows} x {args.length} corpus tokens, "
          f"{time.perf_counter() - start:.0f} s")
    rows = plan.rows(sensitivity)
    print(format_table(rows))
    print(f"plan: {plan.text}\nmean steady-state ratio {plan.cost:.4f} (budget {args.budget}: {plan.budget_cost:.4f}); "
          f"predicted (sum of layers alone) {plan.predicted:.4g} vs {plan.budget_predicted:.4g} uniform")
    out = Path(args.out or f"out/allocate-{loaded.info.name.replace('/', '_')}-{args.budget}")
    paths = [write_csv(sensitivity.rows(), out / "sensitivity.csv"), write_csv(rows, out / "allocation.csv")]
    bar, progress = _bar("compare")
    compared = as_dicts(compare_allocation(loaded, plan, args.eval_windows, args.eval_length, progress))
    bar.close()
    for row in compared:
        row["tier"] = "allocated" if row["tier"] == plan.tier.name else row["tier"]
    columns = ["source", "tier", "ratio_vs_bf16", "steady_state_ratio", "kld", "kld_se", "top1_pct", "top1_se",
               "delta_nll_pct", "delta_nll_se"]
    print(format_table(compared, columns))
    for row in compared:
        row["schedule"] = plan.text if row["tier"] == "allocated" else ""
    paths.append(write_csv(compared, out / "comparison.csv"))
    print("wrote " + ", ".join(map(str, paths)))


def _prompt(args: argparse.Namespace, loaded, default_context: int = 0):
    """--context N: the first N corpus tokens as raw ids; --raw: --prompt as raw text; else a chat message.

    Without --prompt: `default_context` corpus tokens if set, else DEFAULT_PROMPT as a chat message.
    """
    context = args.context or (default_context if args.prompt is None else 0)
    if context:
        from codeckv.corpus import corpus_windows

        return corpus_windows(loaded.tokenizer, 1, context)  # (1, N) ids
    text = args.prompt or DEFAULT_PROMPT
    return text if args.raw else [{"role": "user", "content": text}]


def _write_figures(make: Callable, out: Path) -> list[Path]:
    """Standalone HTML of make(codeckv.figures), plotly.js embedded so the files open offline.

    None without plotly (the `app` extra): the tables and CSVs do not need it.
    """
    if importlib.util.find_spec("plotly") is None:
        print("charts skipped: plotly is not installed (pip install 'codeckv[app]')", file=sys.stderr)
        return []
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in make(importlib.import_module("codeckv.figures")).items():
        path = out / f"{name}.html"
        fig.write_html(path, include_plotlyjs=True)
        paths.append(path)
    return paths


def _sweep(args: argparse.Namespace) -> None:
    from codeckv.measure.sweep import as_dicts, sweep
    from codeckv.measure.table import format_table, write_csv, write_json
    from codeckv.tiers import get_tier

    tiers = [get_tier(name) for name in args.tiers] if args.tiers else None
    loaded = _load(args)
    prompt = _prompt(args, loaded)
    bar, progress = _bar("sweep")
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
    out = Path(args.out or f"out/sweep-{loaded.info.name.replace('/', '_')}")
    write_csv(rows, out / "sweep.csv")
    write_json({
        "model": loaded.info.name, "device": loaded.info.device, "dtype": loaded.info.dtype,
        "prompt_tokens": result.prompt_tokens, "max_new_tokens": args.tokens, "seconds": seconds,
        "native_text": result.native.text, "rows": rows,
        "runs": {label: {**c.summary(), "text": c.codec.text, "token_kld": c.token_kld,
                         "token_nll_native": c.token_nll_native, "token_nll_codec": c.token_nll_codec}
                 for label, c in result.comparisons.items()},
    }, out / "sweep.json")
    paths = _write_figures(lambda figures: figures.sweep_figures(result), out)
    print(f"wrote {out / 'sweep.csv'}, {out / 'sweep.json'}, " + ", ".join(str(p) for p in paths))


def _inspect(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    from codeckv.measure.inspection import capture_kv, inspect_capture
    from codeckv.measure.table import format_table, write_csv, write_json

    loaded = _load(args)
    prompt = _prompt(args, loaded, default_context=128)
    with tqdm(total=2, desc="inspect") as bar:
        capture = capture_kv(loaded, prompt)
        bar.update()
        view = inspect_capture(capture, args.tier, args.layer, args.head)
        bar.update()
    rows = [asdict(e) for e in view.layers]
    print(format_table(rows, [c for c in rows[0] if c != "layer_type"]))
    print(f"{view.tier}: {len(view.tokens)} tokens, archived {view.head.archived[0]}..{view.head.archived[1] - 1}; "
          f"DCT r={view.spectrum.block_size}, energy kept at k={view.spectrum.k}: "
          f"K {float(view.spectrum.key_kept.mean()):.1%}, V {float(view.spectrum.value_kept.mean()):.1%}")
    out = Path(args.out or f"out/inspect-{loaded.info.name.replace('/', '_')}-{view.tier}")
    write_csv(rows, out / "layers.csv")
    write_json({"model": loaded.info.name, **view.summary()}, out / "inspect.json")
    paths = _write_figures(lambda figures: figures.inspect_figures(view), out)
    print(f"wrote {out / 'layers.csv'}, {out / 'inspect.json'}, " + ", ".join(str(p) for p in paths))


def _needle(args: argparse.Namespace) -> None:
    from codeckv.measure.needle import as_dicts, needle_grid
    from codeckv.measure.table import format_table, write_csv
    from codeckv.peers import run_for

    tiers = [run_for(name) for name in args.tiers]
    loaded = _load(args)
    bar, progress = _bar("needle", unit="cell")
    start = time.perf_counter()
    grid = needle_grid(loaded, tiers, args.lengths, args.depths, progress)
    bar.close()
    failed = Counter((r.tier, r.length) for r in grid.rows if r.error)  # cells a peer itself failed on
    summary = [{"tier": tier, **{f"{n} tok": f"{int(grid.retrieved(tier)[:, j].sum())}/{len(grid.depths)}"
                                 + (f" ({failed[tier, n]} failed)" if failed[tier, n] else "")
                                 for j, n in enumerate(grid.lengths)}} for tier in grid.tiers]
    print(format_table(summary))
    for reason in grid.absent:
        print(reason)
    print(f"retrieved / depths {', '.join(f'{d:g}' for d in grid.depths)}; took {time.perf_counter() - start:.1f} s")
    name = loaded.info.name.replace("/", "_")
    out = args.out or f"out/needle-{name}.csv"
    written = write_csv(as_dicts(grid.rows), out)  # before the charts, as in _quality
    paths = _write_figures(lambda figures: {"needle": figures.plots.needle_figure(grid)},
                           Path(args.charts or f"out/needle-{name}"))
    print(f"wrote {written}, " + ", ".join(str(p) for p in paths))


def _prompt_arguments(parser: argparse.ArgumentParser, without_prompt: str) -> None:
    parser.add_argument("--prompt", default=None, help=f"the user's message, a chat turn (default: {without_prompt})")
    parser.add_argument("--raw", action="store_true", help="feed --prompt as raw text, without the chat template")
    parser.add_argument("--context", type=count, default=0, help="use the first N corpus tokens as a raw prompt")


def _memory(args: argparse.Namespace) -> None:
    from codeckv.measure.memory import beside_native, memory_row_isolated, modes_of
    from codeckv.measure.table import format_table, write_csv

    plan = [(t, m, c) for c in args.contexts for t in dict.fromkeys(["native", *args.tiers]) for m in modes_of(t)]
    rows = []
    with tqdm(total=len(plan), desc="memory", unit="turn") as bar:
        for tier, mode, context in plan:
            bar.set_postfix_str(f"{tier} ({mode}) at {context:,} tokens")
            rows.append(memory_row_isolated(args.model, tier, mode, context, args.new_tokens))
            bar.update(1)
    table = beside_native(rows)
    mib = [{**r, **{k: r[k] / 2**20 for k in ("held_bytes", "peak_held_bytes", "at_rest_bytes", "process_peak_bytes")}}
           for r in table]
    print(format_table(mib, ["context", "tier", "mode", "held_bytes", "held_vs_native", "peak_held_bytes",
                             "at_rest_bytes", "process_peak_bytes", "process_peak_saving_of_native", "seconds"]))
    print(f"MiB; one fresh process per row; {rows[0].process_peak_source}; {args.new_tokens} new tokens per turn")
    name = (args.model or "smollm2-135m").replace("/", "_")
    out = args.out or f"out/memory-{name}.csv"
    paths = _write_figures(lambda figures: {
        "memory-held": figures.plots.memory_figure(table),
        "memory-process-peak": figures.plots.memory_figure(table, "process_peak_bytes",
                                                           "Process peak over the turn vs context"),
    }, Path(args.charts or f"out/memory-{name}"))
    print(f"wrote {write_csv(table, out)}, " + ", ".join(str(p) for p in paths))


def _prefill(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    import torch

    from codeckv.measure.prefill import prefill_table
    from codeckv.measure.table import format_table, write_csv
    from codeckv.tiers import TIERS, get_tier

    tiers = [get_tier(name) for name in args.tiers] if args.tiers else list(TIERS.values())
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = _load(args)
    total = len(args.tokens) * args.reps * sum(not t.is_native for t in tiers)
    with tqdm(total=total, desc="prefill") as bar:

        def progress(message: str) -> None:
            bar.set_postfix_str(message)
            bar.update(1)

        rows = [asdict(r) for r in prefill_table(loaded, tiers, args.tokens, args.reps, not args.no_convert, progress)]
    print(format_table(rows, ["tokens", "tier", "native_s", "prefill_s", "ratio", "convert_s", "convert_ratio"]))
    print(f"{loaded.info.device}, {loaded.info.dtype}, {torch.get_num_threads()} threads, median of {args.reps}")
    out = args.out or f"out/prefill-{loaded.info.name.replace('/', '_')}.csv"
    print(f"wrote {write_csv(rows, out)}")


def _latency(args: argparse.Namespace) -> None:
    from codeckv.measure.latency import latency_table
    from codeckv.measure.table import format_table, write_csv
    from codeckv.tiers import get_tier

    tiers = [get_tier(name) for name in args.tiers]
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    loaded = _load(args)
    if args.contexts:
        return _codes_latency(args, loaded, args.contexts, tiers)
    prompt = _prompt(args, loaded, default_context=1024)
    with tqdm(total=2 * len(tiers), desc="latency") as bar:

        def progress(message: str) -> None:
            bar.set_postfix_str(message)
            bar.update(1)

        rows = latency_table(loaded, prompt, tiers, args.tokens, progress)
    print(format_table(rows, ["tier", "materialization_free", "native_decode_ms", "decode_ms", "latency_ratio",
                              "native_prefill_s", "prefill_s", "token_match", "delta_nll_pct", "ratio_vs_bf16"]))
    print(f"{loaded.info.device}, {loaded.info.dtype}: {rows[0]['prompt_tokens']}-token prompt, "
          f"{rows[0]['new_tokens']} new tokens")
    out = args.out or f"out/latency-{loaded.info.name.replace('/', '_')}.csv"
    print(f"wrote {write_csv(rows, out)}")


def _latency_usage(args: argparse.Namespace) -> str | None:
    """What is wrong with a latency command line that argparse cannot see (None: nothing)."""
    if args.contexts and (args.context or args.prompt is not None):
        return "--contexts measures corpus prefixes; it takes no --context or --prompt"
    return None


def _codes_latency(args: argparse.Namespace, loaded, contexts: list[int], tiers) -> None:
    """latency --contexts: the default path (the stored codes; a short context's view) against native per context."""
    import torch

    from codeckv.measure.latency import WARMUP_STEPS, codes_latency_table
    from codeckv.measure.table import format_table, write_csv

    with tqdm(total=len(contexts) * len(tiers), desc="latency (codes)") as bar:

        def progress(message: str) -> None:
            bar.set_postfix_str(message)
            bar.update(1)

        rows = codes_latency_table(loaded, contexts, tiers, args.tokens, progress)
    print(format_table(rows, ["tier", "context", "native_decode_ms", "codes_decode_ms", "latency_ratio",
                              "token_match", "resident_vs_native", "attention"]))
    print(f"{loaded.info.device}, {loaded.info.dtype}, {torch.get_num_threads()} threads: make_cache's default "
          f"path (attention: where the last step read), medians of {args.tokens - WARMUP_STEPS} timed greedy steps, "
          "caches in turns, after one native prefill per context")
    out = args.out or f"out/latency-codes-{loaded.info.name.replace('/', '_')}.csv"
    print(f"wrote {write_csv(rows, out)}")


def _saved_size(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    import torch

    from codeckv.measure.saved_size import saved_size_table
    from codeckv.measure.table import format_table, write_csv
    from codeckv.tiers import TIERS, get_tier

    tiers = [get_tier(name) for name in args.tiers] if args.tiers else [t for t in TIERS.values() if not t.is_native]
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = _load(args)
    name = loaded.info.name.replace("/", "_")
    with tqdm(total=len(tiers), desc="saved-size") as bar:

        def progress(message: str) -> None:
            bar.set_postfix_str(message)
            bar.update(1)

        rows = [asdict(r) for r in saved_size_table(loaded, tiers, args.context, Path(args.files or
                                                    f"out/saved-size-{name}"), progress=progress)]
    print(format_table(rows, ["tier", "tokens", "native_bytes", "view_held_bytes", "rest_held_bytes",
                              "rest_over_native", "restore_ms", "file_bytes", "overhead_bytes", "file_over_archive",
                              "within_target", "load_ms", "resume_exact"]))
    print(f"{loaded.info.device}, {loaded.info.dtype}, {torch.get_num_threads()} threads: a {args.context}-token "
          "corpus prompt + 8 teacher-forced tokens; restore_ms median of 3; target file <= archive x 1.01 + 4 KiB")
    out = args.out or f"out/saved-size-{name}.csv"
    print(f"wrote {write_csv(rows, out)}")


def _pca_size(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    from codeckv.measure.pca_size import SIZE_TEXTS, pca_size_table
    from codeckv.measure.table import format_table, write_csv

    loaded = _load(args)
    with tqdm(total=len(args.tiers) * len(args.texts or SIZE_TEXTS), desc="pca-size") as bar:

        def progress(message: str) -> None:
            bar.set_postfix_str(message)
            bar.update(1)

        rows = [asdict(r) for r in pca_size_table(loaded, args.tiers, args.texts, args.length, args.prefill,
                                                  progress)]
    print(format_table(rows, ["tier", "text", "tokens", "archived_tokens", "archive_pct", "chunks_pct", "budget_pct",
                              "worst_boundary_pct", "worst_layer_pct", "mean_step", "skipped_pct"]))
    print(f"{args.prefill} tokens prefilled, then one at a time up to {args.length}; worst_boundary_pct: the "
          "largest running share of all layers together at a chunk boundary once the sinks are paid back "
          "(worst_layer_pct: of one layer, which keeps its own share of the budget)")
    out = args.out or f"out/pca-size-{loaded.info.name.replace('/', '_')}.csv"
    print(f"wrote {write_csv(rows, out)}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="codeckv", description=__doc__.splitlines()[0],
                                     epilog="codeckv COMMAND --help: that command's options")
    parser.add_argument("--version", action="version", version=f"codeckv {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", default=None, help="smollm2-135m (default), gemma3-270m or a hub id")
    common.add_argument("--offline", action="store_true",
                        help="never touch the network (as HF_HUB_OFFLINE=1): models come from the local caches")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run, help: str) -> argparse.ArgumentParser:  # noqa: A002 - argparse's own word
        cmd = sub.add_parser(name, parents=[common], help=help, description=help.replace("%%", "%"))
        cmd.set_defaults(run=run)
        return cmd

    quality = command("quality", _quality, "per tier: bytes vs bf16, KLD, top-1 and ΔNLL%% with their spread")
    quality.add_argument("--windows", type=positive, default=4, help="text windows (default 4)")
    quality.add_argument("--length", type=positive, default=512, help="tokens per window (default 512)")
    quality.add_argument("--tiers", nargs="*", type=run_name,
                         help="tier or peer names (default: every tier, and every peer installed)")
    quality.add_argument("--source", default="corpus", choices=["corpus", "docstrings"],
                         help="corpus: the Python reference topics (default); docstrings: the held-out text")
    quality.add_argument("--text-file", help="measure on this UTF-8 text file instead")
    quality.add_argument("--pca-bits", type=bits_list, default=[], metavar="B,B,...",
                         help="also PCA tiers at these bits per element (rows pca-<B>b: the PCA frontier)")
    quality.add_argument("--out", help="CSV path (default out/quality-<model>[-<source>].csv)")
    quality.add_argument("--charts", help="folder for the HTML charts (default out/quality-<model>[-<source>])")

    sweep = command("sweep", _sweep, "per tier on one prompt (one sample): bytes, latency, token match, KLD")
    _prompt_arguments(sweep, "a question about KV caches")
    sweep.add_argument("--tokens", type=positive, default=64, help="new tokens per run (default 64)")
    sweep.add_argument("--tiers", nargs="*", type=tier_name, help="tier names (default: all)")
    sweep.add_argument("--no-stop", action="store_true", help="ignore EOS: always generate --tokens tokens")
    sweep.add_argument("--out", help="output folder (default out/sweep-<model>; charts embed plotly.js)")

    inspect = command("inspect", _inspect, "one tier's K/V heatmaps, DCT spectra and per-layer errors")
    _prompt_arguments(inspect, "the first 128 corpus tokens")
    inspect.add_argument("--tier", default="jpeg-k2", type=tier_name, help="tier name (default jpeg-k2)")
    inspect.add_argument("--layer", type=count, default=0, help="layer of the heatmaps (default 0)")
    inspect.add_argument("--head", type=count, default=0, help="KV head of the heatmaps (default 0)")
    inspect.add_argument("--out", help="output folder (default out/inspect-<model>-<tier>)")

    needle = command("needle", _needle, "pass-key retrieval per tier over prompt lengths and key depths")
    needle.add_argument("--lengths", type=positive, nargs="+", default=[1024, 2048, 4096, 8000],
                        help="prompt lengths in tokens (default 1024 2048 4096 8000)")
    needle.add_argument("--depths", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0],
                        help="where the key sits in the filler, 0 = start (default 0 0.25 0.5 0.75 1)")
    needle.add_argument("--tiers", nargs="+", type=run_name, default=["turbo-4", "turbo-3", "int8", "jpeg-k2"],
                        help="tier or peer names (default turbo-4 turbo-3 int8 jpeg-k2)")
    needle.add_argument("--out", help="CSV path (default out/needle-<model>.csv)")
    needle.add_argument("--charts", help="folder for the heatmap (default out/needle-<model>)")

    memory = command("memory", _memory, "held, peak and at-rest bytes of each tier vs native over contexts")
    memory.add_argument("--contexts", type=positive, nargs="+", default=[1024, 2048, 4096, 8192, 16384],
                        help="prompt tokens (default 1024 2048 4096 8192 16384)")
    memory.add_argument("--new-tokens", type=positive, default=64, help="greedy tokens after the prompt (default 64)")
    memory.add_argument("--tiers", nargs="+", type=tier_name, default=["int8", "turbo-4", "pca-8x"],
                        help="tier names; native always runs (default int8 turbo-4 pca-8x)")
    memory.add_argument("--out", help="CSV path (default out/memory-<model>.csv)")
    memory.add_argument("--charts", help="folder for the charts (default out/memory-<model>)")

    prefill = command("prefill", _prefill, "prefill + archiving the prompt vs native prefill, per tier (interleaved)")
    prefill.add_argument("--tokens", type=positive, nargs="+", default=[1024, 4096], help="prompt lengths (1024 4096)")
    prefill.add_argument("--tiers", nargs="*", type=tier_name, help="tier names (default: all)")
    prefill.add_argument("--reps", type=positive, default=3, help="repetitions, medians reported (default 3)")
    prefill.add_argument("--threads", type=count, default=0, help="torch threads (default: torch's own choice)")
    prefill.add_argument("--no-convert", action="store_true", help="skip native prefill + CodecCache.from_cache")
    prefill.add_argument("--out", help="CSV path (default out/prefill-<model>.csv)")

    latency = command("latency", _latency, "decode ms/token native vs tiers, with and without a decoded view")
    _prompt_arguments(latency, "the first 1024 corpus tokens")
    latency.add_argument("--tokens", type=positive, default=64, help="new tokens per run (default 64)")
    latency.add_argument("--tiers", nargs="+", type=tier_name, default=["turbo-4"],
                         help="tier names (default turbo-4)")
    latency.add_argument("--threads", type=count, default=0, help="torch threads (default: torch's own choice)")
    latency.add_argument("--contexts", type=token_counts, default=None, metavar="N,N,...",
                         help="corpus prefix lengths, e.g. 1024,4096,8192: attention on the codes only (no view), "
                              "every tier against one native cache per length")
    latency.add_argument("--out", help="CSV path (default out/latency-<model>.csv, with --contexts "
                                       "out/latency-codes-<model>.csv)")
    latency.set_defaults(usage=_latency_usage)

    allocate = command("allocate", _allocate, "per-layer tiers under a budget from each layer's measured "
                       "sensitivity, then the plan against the uniform budget tier on corpus and docstrings")
    allocate.add_argument("--budget", default="turbo-4", type=tier_name, help="the budget tier (default turbo-4)")
    allocate.add_argument("--ladder", nargs="+", type=tier_name, default=["turbo-3", "turbo-4", "int8"],
                          help="tiers a layer may get (default turbo-3 turbo-4 int8)")
    allocate.add_argument("--method", choices=["fisher", "lockstep"], default="fisher",
                          help="fisher: (g . error)^2 from one forward + backward of the calibration windows (default);"
                               " lockstep: the KLD of each layer compressed alone (one cache per layer and tier)")
    allocate.add_argument("--windows", type=positive, default=4, help="corpus windows to measure on (default 4)")
    allocate.add_argument("--length", type=positive, default=256, help="tokens per window (default 256)")
    allocate.add_argument("--threads", type=count, default=0, help="torch threads (default: torch's own choice)")
    allocate.add_argument("--eval-windows", type=positive, default=4, help="windows of the comparison (default 4)")
    allocate.add_argument("--eval-length", type=positive, default=512, help="tokens per comparison window (512)")
    allocate.add_argument("--out", help="folder for sensitivity.csv, allocation.csv, comparison.csv "
                                        "(default out/allocate-<model>-<budget>)")

    saved = command("saved-size", _saved_size, "per tier: bytes at rest, view rebuild time, saved file vs archive")
    saved.add_argument("--context", type=positive, default=2048, help="prefilled corpus tokens (default 2048)")
    saved.add_argument("--tiers", nargs="*", type=tier_name, help="tier names (default: every codec tier)")
    saved.add_argument("--threads", type=count, default=0, help="torch threads (default: torch's own choice)")
    saved.add_argument("--files", help="folder for the saved cache files (default out/saved-size-<model>)")
    saved.add_argument("--out", help="CSV path (default out/saved-size-<model>.csv)")

    size = command("pca-size", _pca_size, "PCA tiers: bytes vs bf16 and their budget on texts far from calibration")
    size.add_argument("--tiers", nargs="+", type=tier_name, default=["pca-8x", "pca-16x", "pca-32x"],
                      help="PCA tier names (default pca-8x pca-16x pca-32x)")
    size.add_argument("--texts", nargs="+", default=None,
                      help="corpus docstrings code numbers multilingual repeated (default: all)")
    size.add_argument("--length", type=positive, default=512, help="tokens per text (default 512)")
    size.add_argument("--prefill", type=positive, default=384, help="tokens in the first forward (default 384)")
    size.add_argument("--out", help="CSV path (default out/pca-size-<model>.csv)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; the exit status (module docstring) is returned, never raised."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        problem = args.usage(args) if hasattr(args, "usage") else None
        if problem:
            parser.error(f"{args.command}: {problem}")
    except SystemExit as done:  # --help, --version (0) or a usage error (2)
        return done.code if isinstance(done.code, int) else 2
    if args.offline:
        os.environ["HF_HUB_OFFLINE"] = "1"  # read by huggingface_hub on import, which happens after this
    try:
        args.run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, RuntimeError, OSError) as err:  # ModelUnavailableError is a RuntimeError
        print(f"error: {err}".splitlines()[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
