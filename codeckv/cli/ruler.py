"""codeckv ruler: RULER-style long-context scores per tier and length, one native prefill per sample."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from codeckv.cli.common import add_grid_arguments, file_stem, grid_backend, model_context, write_figures
from codeckv.cli.types import count, positive, run_name
from codeckv.presses.base import PRESS_MODE_MEANING, PRESS_MODES

NAME = "ruler"
HELP = "RULER-style long-context tasks per tier and length (score 0-100), one native prefill per sample"
DEFAULT_TIERS = ["int8", "turbo-4", "turbo-3", "snapkv-50", "expected-50"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from codeckv.measure.long_tasks import TASK_NAMES
    from codeckv.measure.long_tasks.haystack import DEFAULT_HAYSTACK

    parser.add_argument("--lengths", type=positive, nargs="+", default=[4096],
                        help="prompt + answer budget in tokens (default 4096; the field: 4096 8192 16384 ...)")
    parser.add_argument("--tasks", nargs="+", choices=TASK_NAMES, default=list(TASK_NAMES), metavar="TASK",
                        help=f"default: all {len(TASK_NAMES)} ({', '.join(TASK_NAMES)}; RULER's QA tasks, "
                             "which read downloads, are left out)")
    parser.add_argument("--samples", type=positive, default=4, help="samples per task and length (default 4)")
    parser.add_argument("--seed", type=count, default=0, help="draws the samples (default 0)")
    parser.add_argument("--tiers", nargs="+", type=run_name, default=DEFAULT_TIERS,
                        help=f"tier, peer or llama.cpp type names (default {' '.join(DEFAULT_TIERS)}); native always")
    parser.add_argument("--press-mode", choices=PRESS_MODES, default="once",
                        help="a press's protocol (default once: its cache built from the shared prefill): "
                             + "; ".join(f"{mode} = {meaning}" for mode, meaning in PRESS_MODE_MEANING.items()))
    parser.add_argument("--haystack", default=DEFAULT_HAYSTACK,
                        help="the essay haystack: corpus, docstrings, bible (default) or a UTF-8 text file")
    add_grid_arguments(parser)
    parser.add_argument("--out", help="CSV path of the averages (default out/ruler-<model>.csv); each answer goes to "
                                      "<out>-samples.csv as its sample finishes")
    parser.add_argument("--charts", help="folder for the HTML charts of the whole CSV (default out/ruler-<model>)")
    parser.add_argument("--update", action="store_true",
                        help="keep the rows of both CSVs (same --seed, --haystack) and measure only the samples and "
                             "tiers they lack: resumes an interrupted run, or grows --samples")


def run(args: argparse.Namespace) -> None:
    from codeckv.grid import run_grid
    from codeckv.grid.runner import kept_rows, read_rows, write_rows
    from codeckv.measure.long_tasks import check_sample_fits
    from codeckv.measure.long_tasks.haystack import haystack_text
    from codeckv.measure.ruler import as_dicts, check_grid, row_key, summarize
    from codeckv.measure.ruler_job import RulerJob
    from codeckv.measure.table import format_table, numbers
    from codeckv.models import model_tokenizer

    # a bad haystack file, a length past the context or too short for a task, an --update of other samples: each
    # said before the model loads
    haystack_text(args.haystack)
    model, context = model_context(args)
    check_grid(model, context, args.tasks, args.lengths, args.samples)
    tokenizer = model_tokenizer(model)
    for task in args.tasks:
        for length in args.lengths:
            check_sample_fits(task, tokenizer, length, args.seed, args.haystack)
    job = RulerJob(model, args.tiers, args.tasks, args.lengths, args.samples, args.seed, args.haystack,
                   args.press_mode)
    out = Path(args.out or f"out/ruler-{file_stem(model)}.csv")
    averages_kept = kept_rows(job, out, args.update)
    start = time.perf_counter()
    samples = run_grid(job, out.with_name(f"{out.stem}-samples{out.suffix}"), grid_backend(args), args.update)
    summary = as_dicts(summarize(samples))
    measured = {row_key(row) for row in summary}
    averages = [row for row in averages_kept if row_key(row) not in measured] + summary  # older rows first
    if not averages:
        print("nothing measured")
        return
    write_rows(averages, out)
    names, asked = job.names(), {(t, length) for t in args.tasks for length in args.lengths}
    table = [row for row in summary if row["tier"] in names and (row["task"], row["length"]) in asked]
    print(format_table(table, ["task", "length", "tier", "samples", "score", "score_se", "seconds", "prefill_share",
                               "stored_vs_bf16", "press_mode"]))
    print(_averages(table))
    presses = any(row["press_mode"] for row in table)
    protocol = f"; presses {args.press_mode}: {PRESS_MODE_MEANING[args.press_mode]}" if presses else ""
    print(f"{args.samples} samples per task and length, seed {args.seed}, haystack {args.haystack}{protocol}; "
          f"took {time.perf_counter() - start:.1f} s")
    points = [numbers(row) for row in read_rows(out)]  # the whole CSV, kept rows too
    lengths = sorted({int(row["length"]) for row in points})
    paths = write_figures(lambda figures: {"ruler_scores": figures.ruler_heatmap_figure(points, model),
                                           **{f"ruler_bytes_{n}": figures.ruler_bytes_figure(points, n, model)
                                              for n in lengths}},
                          Path(args.charts or f"out/ruler-{file_stem(model)}"))
    print(f"wrote {out}, " + ", ".join(str(p) for p in paths))


def _averages(rows: list[dict]) -> str:
    """The RULER average (mean over the tasks) per tier and length, with its standard error (the tasks' errors
    combined: se of a mean of independent means), as a table."""
    from codeckv.measure.table import format_table

    lengths = sorted({row["length"] for row in rows})
    tiers = list(dict.fromkeys(row["tier"] for row in rows))
    table = []
    for tier in tiers:
        line = {"tier": tier}
        for length in lengths:
            cells = [row for row in rows if row["tier"] == tier and row["length"] == length]
            line[f"{length} tok"] = sum(r["score"] for r in cells) / len(cells) if cells else float("nan")
            line[f"{length} se"] = (sum(r["score_se"] ** 2 for r in cells) ** 0.5 / len(cells) if cells
                                    else float("nan"))
        table.append(line)
    return "RULER average over the tasks measured:\n" + format_table(table)
