"""codeckv quality: per tier and peer, bytes vs bf16, KLD, top-1 and ΔNLL with their spread over windows."""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

from codeckv.cli.common import (
    add_grid_arguments,
    file_stem,
    forward_bar,
    grid_backend,
    load,
    model_context,
    set_threads,
    write_figures,
)
from codeckv.cli.types import bits_list, positive, run_name
from codeckv.measure.depth_job import DEPTH_SCORED
from codeckv.presses.base import PRESS_MODE_MEANING, PRESS_MODES

NAME = "quality"
HELP = "per tier: bytes vs bf16, KLD, top-1 and ΔNLL%% with their spread"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--windows", type=positive, default=4,
                        help="text windows (default 4); with --ray a window is a cell of codeckv/grid/'s runner")
    parser.add_argument("--length", type=positive, default=512, help="tokens per window (default 512)")
    parser.add_argument("--prefix", type=positive,
                        help="tokens prefilled per window before the scored ones, the context a press evicts from "
                             "(default half the window; the committed press rows: --length 1280 --prefix 1024)")
    parser.add_argument("--press-mode", choices=PRESS_MODES, default="once",
                        help="a press's protocol (default once): " + "; ".join(f"{mode} = {meaning}" for mode, meaning
                                                                                in PRESS_MODE_MEANING.items()))
    parser.add_argument("--tiers", nargs="*", type=run_name,
                        help="tier or peer names, llama.cpp's KV types too (default: every tier, every peer installed)")
    parser.add_argument("--source", default="corpus", choices=["corpus", "docstrings", "bible"],
                        help="corpus: the Python reference topics (default); docstrings: the held-out text; "
                             "bible: the King James Bible, prose of another domain")
    parser.add_argument("--text-file", help="measure on this UTF-8 text file instead")
    parser.add_argument("--pca-bits", type=bits_list, default=[], metavar="B,B,...",
                        help="also PCA tiers at these bits per element (rows pca-<B>b: the PCA frontier)")
    parser.add_argument("--shared-prefill", action="store_true",
                        help="prefill each window's prefix natively once and build every tier from it (the once "
                             "protocol; tiers only, no peers): measure/shared_quality.py, far faster for many tiers")
    parser.add_argument("--depths", type=positive, nargs="+", metavar="TOKENS",
                        help="quality at depth: for each, windows of TOKENS + 256, the first TOKENS prefilled once "
                             "and every tier built from it (as --shared-prefill), the next 256 scored; one CSV with "
                             "every depth's rows (prefix_tokens) and a chart per metric against depth; a depth is a "
                             "cell of codeckv/grid/'s runner: --ray, --threads, --update resume")
    add_grid_arguments(parser)
    parser.add_argument("--out", help="CSV path (default out/quality-<model>[-<source>].csv; with --ray, each window's "
                                      "rows go to <out>-windows.csv as it finishes, removed once the table is "
                                      "written; with --depths out/depth-<model>[-<source>].csv, written as each "
                                      "depth finishes)")
    parser.add_argument("--update", action="store_true",
                        help="keep the other rows of the CSV at --out (measured on the same text, windows and length "
                             "against the same native run) and replace or add these tiers' rows; with --ray, also "
                             "resume the windows <out>-windows.csv holds; with --depths, keep its depths and measure "
                             "only those it lacks")
    parser.add_argument("--charts", help="folder for the HTML charts (default out/quality-<model>[-<source>])")


def run(args: argparse.Namespace) -> None:
    from codeckv.measure.peers import PEER_NAMES, run_for
    from codeckv.measure.quality import as_dicts
    from codeckv.measure.table import format_table, merge_rows, numbers, write_csv
    from codeckv.tiers import TIERS, pca_tier

    named = [run_for(name) for name in args.tiers or [*TIERS, *PEER_NAMES]]
    text = Path(args.text_file).read_text(encoding="utf-8") if args.text_file else None
    if args.depths:
        return _at_depths(args, named, text)
    start = time.perf_counter()
    model, stem = _stem(args, text)
    out = Path(args.out or f"out/{stem}.csv")
    if args.ray is None:
        result = _in_one_batch(args, named + [pca_tier(bits) for bits in args.pca_bits], text)
    else:
        result, windows_csv = _on_the_grid(args, model, named, text, out)
    rows = as_dicts(result.rows)
    columns = ["tier", "stored_vs_bf16", "ratio_vs_bf16", "held_bytes", "kld", "kld_se", "kld_p99", "kld_max",
               "top1_pct", "top1_se", "delta_nll_pct", "delta_nll_se", "dp_rms"]
    print(format_table(rows, columns))
    for reason in result.absent:
        print(reason)
    where = "a text file" if text is not None else f"the {args.source}"
    presses = any(row["press_mode"] for row in rows)
    protocol = f"; presses: {args.press_mode} ({PRESS_MODE_MEANING[args.press_mode]})" if presses else ""
    print(f"{args.windows} windows x {args.length} tokens of {where}, {result.reference.prefix} prefilled and "
          f"{result.reference.positions} scored each{protocol}; took {time.perf_counter() - start:.1f} s")
    merged = args.update and out.exists()
    if merged:
        _check_same_native(out, rows)
        rows = merge_rows(out, rows, [*TIERS, *PEER_NAMES],
                          same=("source", "windows", "tokens_per_window", "prefix_tokens"))
    written = write_csv(rows, out)  # before the charts: numbers never hang on figures
    if args.ray is not None:
        windows_csv.unlink()  # a run in progress is over: its table holds what it measured
    points = [numbers(row) for row in rows] if merged else None  # the Pareto charts show the whole table
    paths = write_figures(lambda figures: figures.quality_figures(result, points), Path(args.charts or f"out/{stem}"))
    print(f"wrote {written}, " + ", ".join(str(p) for p in paths))


def _stem(args, text) -> tuple[str, str]:
    """--model's name and the file stem of its table and charts: quality-<model>[-<source>]."""
    from codeckv.models import DEFAULT_MODEL

    model = args.model or DEFAULT_MODEL
    suffix = "" if text is None and args.source == "corpus" else f"-{'text' if text is not None else args.source}"
    return model, f"quality-{file_stem(model)}{suffix}"


def _in_one_batch(args, tiers, text):
    """The windows fed together in one process: lockstep (measure/quality.py) or one prefill (--shared-prefill)."""
    from codeckv.measure.quality import measure_quality
    from codeckv.measure.shared_quality import shared_quality
    from codeckv.tiers import Tier

    set_threads(args.threads)
    loaded = load(args)
    bar, progress = forward_bar("quality")
    if args.shared_prefill:
        if args.press_mode != "once" or any(not isinstance(t, Tier) for t in tiers):
            raise SystemExit("--shared-prefill measures tiers under the once protocol (allowed: --press-mode once, "
                             "tier names only, no peers)")
        result = shared_quality(loaded, tiers, args.windows, args.length, args.prefix or (args.length + 1) // 2,
                                args.source, text, progress)
    else:
        result = measure_quality(loaded, tiers, args.windows, args.length, args.source, text, progress, args.prefix,
                                 args.press_mode)
    bar.close()
    return result


def _on_the_grid(args, model: str, tiers, text, out: Path):
    """--ray over windows: a cell per window on the grid runner (measure/window_job.py), its rows appended to
    <out>-windows.csv as each window ends (--update resumes them), the table combined from them when all are in.
    Returns the run and that CSV; the text, windows and protocol are refused before any model loads."""
    from codeckv.grid import run_grid
    from codeckv.measure.window_job import WindowJob
    from codeckv.models import model_tokenizer

    if args.shared_prefill:
        raise ValueError("--ray feeds each window in lockstep (a cell per window): leave out --shared-prefill")
    source = "text" if text is not None else args.source
    job = WindowJob(model, [t.name for t in tiers], args.windows, args.length, args.prefix or (args.length + 1) // 2,
                    source, text, args.press_mode, args.pca_bits)
    tokenizer = model_tokenizer(model)
    windows = job.reference_windows(tokenizer)  # a text too short for them is refused here, not in every worker
    windows_csv = out.with_name(f"{out.stem}-windows.csv")
    rows = run_grid(job, windows_csv, grid_backend(args), args.update)
    return job.combine(rows, windows, tokenizer), windows_csv


def _at_depths(args, tiers, text) -> None:
    """--depths on the grid runner: a cell per depth (measure/depth_job.py), then a chart per metric against it.
    `tiers` are the named ones (the job adds --pca-bits' own); tiers, protocol and the longest window are refused
    before any model loads (its context from its config)."""
    from codeckv.grid import run_grid
    from codeckv.measure.depth_job import DepthJob
    from codeckv.measure.table import format_table, numbers
    from codeckv.tiers import Tier

    if any(not isinstance(t, Tier) for t in tiers) or args.press_mode != "once":
        raise ValueError("--depths builds every tier from one prefill per window (the once protocol): tier names "
                         "only, no peers, --press-mode once")
    model, context = model_context(args)
    longest = max(args.depths) + DEPTH_SCORED + 1
    if longest > context:
        raise ValueError(f"--depths {max(args.depths)}: {longest} tokens a window, more than {model}'s context of "
                         f"{context}")
    source = "text" if text is not None else args.source
    job = DepthJob(model, [t.name for t in tiers], sorted(set(args.depths)), args.windows, source, text,
                   args.pca_bits)
    stem = f"depth-{file_stem(model)}{'' if source == 'corpus' else f'-{source}'}"
    out = Path(args.out or f"out/{stem}.csv")
    start = time.perf_counter()
    rows = [numbers(row) for row in run_grid(job, out, grid_backend(args), args.update)]
    if not rows:
        print("nothing measured")
        return
    print(format_table(rows, ["prefix_tokens", "tier", "stored_vs_bf16", "kld", "kld_se", "top1_pct", "top1_se",
                              "delta_nll_pct", "delta_nll_se"]))
    where = "a text file" if text is not None else f"the {args.source}"
    depths = sorted({int(row["prefix_tokens"]) for row in rows})
    took = time.perf_counter() - start
    print(f"{args.windows} windows of {where} per depth, the first {'/'.join(map(str, depths))} tokens prefilled "
          f"once and each tier built from them, the next {DEPTH_SCORED} scored; took {took:.1f} s")
    paths = write_figures(lambda figures: {f"depth_{metric}": figures.depth_figure(rows, metric, model)
                                           for metric in ("kld", "top1_pct", "delta_nll_pct")},
                          Path(args.charts or f"out/{stem}"))
    print(f"wrote {out}, " + ", ".join(str(p) for p in paths))


def _check_same_native(path: Path, rows: list[dict]) -> None:
    """--update keeps rows scored against another run of native only if that run is this one: same model, same
    windows (their native NLL agrees to the float noise of a batch shape, far below any change of text or model)."""
    with path.open(newline="") as f:
        old = next((float(row["nll"]) for row in csv.DictReader(f) if row["tier"] == "native"), None)
    new = next(float(row["nll"]) for row in rows if row["tier"] == "native")
    if old is None or abs(old - new) > 1e-4 * abs(new):
        raise ValueError(f"--update: {path} was not measured against this native run (native NLL {old} there, "
                         f"{new:.6f} here: another model, text or window): write a new CSV")
