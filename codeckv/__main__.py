"""Command line: python -m codeckv quality|sweep|needle|inspect|memory|prefill|latency|saved-size ...

Tables on stdout; CSV, JSON and HTML files.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from tqdm import tqdm

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


def _bits_list(text: str) -> list[float]:
    """'1,1.5,2' -> [1.0, 1.5, 2.0] (argparse type of --pca-bits)."""
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers (e.g. 1,1.5,2)") from None


def _quality(args: argparse.Namespace) -> None:
    from codeckv.figures import quality_figures
    from codeckv.measure.quality import as_dicts, measure_quality
    from codeckv.measure.table import format_table, write_csv
    from codeckv.models import load_model
    from codeckv.tiers import TIERS, get_tier, pca_tier

    tiers = [get_tier(name) for name in args.tiers or list(TIERS)]  # unknown names fail before loading
    tiers += [pca_tier(bits) for bits in args.pca_bits]
    text = Path(args.text_file).read_text(encoding="utf-8") if args.text_file else None
    loaded = load_model(args.model)
    bar, progress = _bar("quality")
    start = time.perf_counter()
    run = measure_quality(loaded, tiers, args.windows, args.length, args.source, text, progress)
    bar.close()
    rows = as_dicts(run.rows)
    columns = ["tier", "ratio_vs_bf16", "steady_state_ratio", "kld", "kld_se", "top1_pct", "top1_se",
               "delta_nll_pct", "delta_nll_se", "nll", "entropy_coded_bytes"]
    print(format_table(rows, columns))
    where = "a text file" if text is not None else f"the {args.source}"
    print(f"{args.windows} windows x {args.length} tokens of {where}, {run.reference.positions} scored positions "
          f"each; took {time.perf_counter() - start:.1f} s")
    name = loaded.info.name.replace("/", "_")
    suffix = "" if text is None and args.source == "corpus" else f"-{'text' if text is not None else args.source}"
    out = args.out or f"assets/quality-{name}{suffix}.csv"
    paths = _write_figures(quality_figures(run), Path(args.charts or f"out/quality-{name}{suffix}"))
    print(f"wrote {write_csv(rows, out)}, " + ", ".join(str(p) for p in paths))


def _prompt(args: argparse.Namespace, loaded, default_context: int = 0):
    """--context N: the first N corpus tokens as raw ids; --raw: --prompt as raw text; else a chat message.

    Without --prompt: `default_context` corpus tokens if set, else DEFAULT_PROMPT as a chat message.
    """
    context = args.context or (default_context if args.prompt is None else 0)
    if context:
        from codeckv.measure.corpus import corpus_windows

        return corpus_windows(loaded.tokenizer, 1, context)  # (1, N) ids
    text = args.prompt or DEFAULT_PROMPT
    return text if args.raw else [{"role": "user", "content": text}]


def _write_figures(figures: dict, out: Path) -> list[Path]:
    """Standalone HTML, plotly.js embedded so the files open offline."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in figures.items():
        path = out / f"{name}.html"
        fig.write_html(path, include_plotlyjs=True)
        paths.append(path)
    return paths


def _sweep(args: argparse.Namespace) -> None:
    from codeckv.figures import sweep_figures
    from codeckv.measure.sweep import as_dicts, sweep
    from codeckv.measure.table import format_table, write_csv, write_json
    from codeckv.models import load_model
    from codeckv.tiers import get_tier

    tiers = [get_tier(name) for name in args.tiers] if args.tiers else None  # unknown names fail before loading
    loaded = load_model(args.model)
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
    paths = _write_figures(sweep_figures(result), out)
    print(f"wrote {out / 'sweep.csv'}, {out / 'sweep.json'}, " + ", ".join(str(p) for p in paths))


def _inspect(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    from codeckv.figures import inspect_figures
    from codeckv.measure.inspect import capture_kv, inspect_capture
    from codeckv.measure.table import format_table, write_csv, write_json
    from codeckv.models import load_model

    loaded = load_model(args.model)
    prompt = _prompt(args, loaded, default_context=128)
    with tqdm(total=3, desc="inspect") as bar:
        capture = capture_kv(loaded, prompt)
        bar.update()
        view = inspect_capture(capture, args.tier, args.layer, args.head)
        bar.update()
        figures = inspect_figures(view)
        bar.update()
    rows = [asdict(e) for e in view.layers]
    print(format_table(rows, [c for c in rows[0] if c != "layer_type"]))
    print(f"{view.tier}: {len(view.tokens)} tokens, archived {view.head.archived[0]}..{view.head.archived[1] - 1}; "
          f"DCT r={view.spectrum.block_size}, energy kept at k={view.spectrum.k}: "
          f"K {float(view.spectrum.key_kept.mean()):.1%}, V {float(view.spectrum.value_kept.mean()):.1%}")
    out = Path(args.out or f"out/inspect-{loaded.info.name.replace('/', '_')}-{view.tier}")
    write_csv(rows, out / "layers.csv")
    write_json({"model": loaded.info.name, **view.summary()}, out / "inspect.json")
    paths = _write_figures(figures, out)
    print(f"wrote {out / 'layers.csv'}, {out / 'inspect.json'}, " + ", ".join(str(p) for p in paths))


def _needle(args: argparse.Namespace) -> None:
    from codeckv.measure.needle import as_dicts, needle_grid
    from codeckv.measure.table import format_table, write_csv
    from codeckv.models import load_model
    from codeckv.plots import needle_figure
    from codeckv.tiers import get_tier

    tiers = [get_tier(name) for name in args.tiers]  # unknown names fail before loading
    loaded = load_model(args.model)
    bar, progress = _bar("needle", unit="cell")
    start = time.perf_counter()
    grid = needle_grid(loaded, tiers, args.lengths, args.depths, progress)
    bar.close()
    summary = [{"tier": tier, **{f"{n} tok": f"{int(grid.retrieved(tier)[:, j].sum())}/{len(grid.depths)}"
                                 for j, n in enumerate(grid.lengths)}} for tier in grid.tiers]
    print(format_table(summary))
    print(f"retrieved / depths {', '.join(f'{d:g}' for d in grid.depths)}; took {time.perf_counter() - start:.1f} s")
    name = loaded.info.name.replace("/", "_")
    out = args.out or f"assets/needle-{name}.csv"
    paths = _write_figures({"needle": needle_figure(grid)}, Path(args.charts or f"out/needle-{name}"))
    print(f"wrote {write_csv(as_dicts(grid.rows), out)}, " + ", ".join(str(p) for p in paths))


def _prompt_arguments(parser: argparse.ArgumentParser, without_prompt: str) -> None:
    parser.add_argument("--model", default=None, help="smollm2-135m (default), gemma3-270m or a hub id")
    parser.add_argument("--prompt", default=None, help=f"the user's message, a chat turn (default: {without_prompt})")
    parser.add_argument("--raw", action="store_true", help="feed --prompt as raw text, without the chat template")
    parser.add_argument("--context", type=int, default=0, help="use the first N corpus tokens as a raw prompt")


def _memory(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    from codeckv.measure.memory import memory_table
    from codeckv.measure.table import format_table, write_csv
    from codeckv.models import load_model

    loaded = load_model(args.model)
    rows = [asdict(r) for r in memory_table(loaded, args.tiers, args.context, args.decode)]
    print(format_table(rows))
    out = args.out or f"assets/memory-{loaded.info.name.replace('/', '_')}-{args.context}.csv"
    print(f"wrote {write_csv(rows, out)}")


def _prefill(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    import torch

    from codeckv.measure.prefill import prefill_table
    from codeckv.measure.table import format_table, write_csv
    from codeckv.models import load_model
    from codeckv.tiers import TIERS, get_tier

    tiers = [get_tier(name) for name in args.tiers] if args.tiers else list(TIERS.values())
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    total = len(args.tokens) * args.reps * sum(not t.is_native for t in tiers)
    with tqdm(total=total, desc="prefill") as bar:

        def progress(message: str) -> None:
            bar.set_postfix_str(message)
            bar.update(1)

        rows = [asdict(r) for r in prefill_table(loaded, tiers, args.tokens, args.reps, not args.no_convert, progress)]
    print(format_table(rows, ["tokens", "tier", "native_s", "prefill_s", "ratio", "convert_s", "convert_ratio"]))
    print(f"{loaded.info.device}, {loaded.info.dtype}, {torch.get_num_threads()} threads, median of {args.reps}")
    out = args.out or f"assets/prefill-{loaded.info.name.replace('/', '_')}.csv"
    print(f"wrote {write_csv(rows, out)}")


def _latency(args: argparse.Namespace) -> None:
    from codeckv.measure.latency import latency_table
    from codeckv.measure.table import format_table, write_csv
    from codeckv.models import load_model
    from codeckv.tiers import get_tier

    tiers = [get_tier(name) for name in args.tiers]
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
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
    out = args.out or f"assets/latency-{loaded.info.name.replace('/', '_')}.csv"
    print(f"wrote {write_csv(rows, out)}")


def _saved_size(args: argparse.Namespace) -> None:
    from dataclasses import asdict

    import torch

    from codeckv.measure.saved_size import saved_size_table
    from codeckv.measure.table import format_table, write_csv
    from codeckv.models import load_model
    from codeckv.tiers import TIERS, get_tier

    tiers = [get_tier(name) for name in args.tiers] if args.tiers else [t for t in TIERS.values() if not t.is_native]
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
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
    out = args.out or f"assets/saved-size-{name}.csv"
    print(f"wrote {write_csv(rows, out)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m codeckv", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    quality = sub.add_parser("quality", help="per tier: bytes vs bf16, KLD, top-1 and ΔNLL%% with their spread")
    quality.add_argument("--model", default=None, help="smollm2-135m (default), gemma3-270m or a hub id")
    quality.add_argument("--windows", type=int, default=4, help="text windows (default 4)")
    quality.add_argument("--length", type=int, default=512, help="tokens per window (default 512)")
    quality.add_argument("--tiers", nargs="*", help="tier names (default: all)")
    quality.add_argument("--source", default="corpus", choices=["corpus", "docstrings"],
                         help="corpus: the Python reference topics (default); docstrings: the held-out text")
    quality.add_argument("--text-file", help="measure on this UTF-8 text file instead")
    quality.add_argument("--pca-bits", type=_bits_list, default=[], metavar="B,B,...",
                         help="also PCA tiers at these bits per element (rows pca-<B>b: the PCA frontier)")
    quality.add_argument("--out", help="CSV path (default assets/quality-<model>[-<source>].csv)")
    quality.add_argument("--charts", help="folder for the HTML charts (default out/quality-<model>[-<source>])")
    quality.set_defaults(run=_quality)

    sweep = sub.add_parser("sweep", help="per tier on one prompt (one sample): bytes, latency, token match, KLD")
    _prompt_arguments(sweep, "a question about KV caches")
    sweep.add_argument("--tokens", type=int, default=64, help="new tokens per run (default 64)")
    sweep.add_argument("--tiers", nargs="*", help="tier names (default: all)")
    sweep.add_argument("--no-stop", action="store_true", help="ignore EOS: always generate --tokens tokens")
    sweep.add_argument("--out", help="output folder (default out/sweep-<model>; charts embed plotly.js)")
    sweep.set_defaults(run=_sweep)

    inspect = sub.add_parser("inspect", help="one tier's K/V heatmaps, DCT spectra and per-layer errors")
    _prompt_arguments(inspect, "the first 128 corpus tokens")
    inspect.add_argument("--tier", default="jpeg-k2", help="tier name (default jpeg-k2)")
    inspect.add_argument("--layer", type=int, default=0, help="layer of the heatmaps (default 0)")
    inspect.add_argument("--head", type=int, default=0, help="KV head of the heatmaps (default 0)")
    inspect.add_argument("--out", help="output folder (default out/inspect-<model>-<tier>)")
    inspect.set_defaults(run=_inspect)

    needle = sub.add_parser("needle", help="pass-key retrieval per tier over prompt lengths and key depths")
    needle.add_argument("--model", default=None, help="smollm2-135m (default), gemma3-270m or a hub id")
    needle.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8000],
                        help="prompt lengths in tokens (default 1024 2048 4096 8000)")
    needle.add_argument("--depths", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0],
                        help="where the key sits in the filler, 0 = start (default 0 0.25 0.5 0.75 1)")
    needle.add_argument("--tiers", nargs="+", default=["turbo-4", "turbo-3", "int8", "jpeg-k2"], help="tier names")
    needle.add_argument("--out", help="CSV path (default assets/needle-<model>.csv)")
    needle.add_argument("--charts", help="folder for the heatmap (default out/needle-<model>)")
    needle.set_defaults(run=_needle)

    memory = sub.add_parser("memory", help="archive vs resident bytes at a long context, with and without a view")
    memory.add_argument("--model", default=None, help="smollm2-135m (default), gemma3-270m or a hub id")
    memory.add_argument("--context", type=int, default=4096, help="prefilled corpus tokens (default 4096)")
    memory.add_argument("--decode", type=int, default=16, help="decode steps after the prefill (default 16)")
    memory.add_argument("--tiers", nargs="+", default=["jpeg-k8-int8", "turbo-4"], help="tier names")
    memory.add_argument("--out", help="CSV path (default assets/memory-<model>-<context>.csv)")
    memory.set_defaults(run=_memory)

    prefill = sub.add_parser("prefill", help="prefill + archiving the prompt vs native prefill, per tier (interleaved)")
    prefill.add_argument("--model", default=None, help="smollm2-135m (default), gemma3-270m or a hub id")
    prefill.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096], help="prompt lengths (1024 4096)")
    prefill.add_argument("--tiers", nargs="*", help="tier names (default: all)")
    prefill.add_argument("--reps", type=int, default=3, help="repetitions, medians reported (default 3)")
    prefill.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own choice)")
    prefill.add_argument("--no-convert", action="store_true", help="skip native prefill + CodecCache.from_cache")
    prefill.add_argument("--out", help="CSV path (default assets/prefill-<model>.csv)")
    prefill.set_defaults(run=_prefill)

    latency = sub.add_parser("latency", help="decode ms/token native vs tiers, with and without a decoded view")
    _prompt_arguments(latency, "the first 1024 corpus tokens")
    latency.add_argument("--tokens", type=int, default=64, help="new tokens per run (default 64)")
    latency.add_argument("--tiers", nargs="+", default=["turbo-4"], help="tier names (default turbo-4)")
    latency.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own choice)")
    latency.add_argument("--out", help="CSV path (default assets/latency-<model>.csv)")
    latency.set_defaults(run=_latency)

    saved = sub.add_parser("saved-size", help="per tier: bytes at rest, view rebuild time, saved file vs archive")
    saved.add_argument("--model", default=None, help="smollm2-135m (default), gemma3-270m or a hub id")
    saved.add_argument("--context", type=int, default=2048, help="prefilled corpus tokens (default 2048)")
    saved.add_argument("--tiers", nargs="*", help="tier names (default: every codec tier)")
    saved.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own choice)")
    saved.add_argument("--files", help="folder for the saved cache files (default out/saved-size-<model>)")
    saved.add_argument("--out", help="CSV path (default assets/saved-size-<model>.csv)")
    saved.set_defaults(run=_saved_size)

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
