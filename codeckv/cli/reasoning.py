"""codeckv reasoning: word problems with chain of thought, every tier followed along its own long generation."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from codeckv.cli.common import add_grid_arguments, file_stem, grid_backend, model_context, write_figures
from codeckv.cli.types import count, positive, run_name

NAME = "reasoning"
HELP = ("word problems with chain of thought per tier: accuracy, agreement and flips against native, first "
        "departure, KLD and top-1 along the tier's own generation")
DEFAULT_TIERS = ["int8", "turbo-4", "turbo-3", "turbo-3-skip2", "tova-decoding256"]
DEFAULT_STEPS = [2, 3, 4]  # native Qwen2.5-Coder-0.5B: 80 / 40 / 0% (docs/reasoning.md)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=positive, default=20, help="problems, numbered from 0 (default 20)")
    parser.add_argument("--seed", type=count, default=0, help="draws the problems (default 0)")
    parser.add_argument("--steps", type=positive, nargs="+", default=DEFAULT_STEPS,
                        help="arithmetic operations a problem takes, 2..8, the values in turn "
                             f"(default {' '.join(map(str, DEFAULT_STEPS))})")
    parser.add_argument("--tiers", nargs="+", type=run_name, default=DEFAULT_TIERS,
                        help=f"tier, peer or llama.cpp type names (default {' '.join(DEFAULT_TIERS)}); native always, "
                             "llama.cpp's f16 whenever a llama.cpp type is named")
    parser.add_argument("--budget", type=positive, default=256,
                        help="most tokens a reply may generate (default 256)")
    add_grid_arguments(parser)
    parser.add_argument("--out", help="summary CSV (default out/reasoning-<model>.csv); beside it <stem>-problems.csv "
                                      "(one row per problem and tier, written after every problem) and "
                                      "<stem>-curve.csv (KLD along the generation)")
    parser.add_argument("--charts", help="folder for the HTML charts (default out/reasoning-<model>)")
    parser.add_argument("--update", action="store_true",
                        help="keep the problem rows already in <stem>-problems.csv (same --seed, --budget, --steps) "
                             "and measure only the (problem, tier) rows it lacks: resumes a run or grows it")


def sibling(out: Path, suffix: str) -> Path:
    return out.with_name(f"{out.stem}-{suffix}{out.suffix}")


def _check_kept(kept: list[dict], args: argparse.Namespace, path: Path) -> None:
    """Refuse to grow a CSV measured with another step cycle (another seed or budget: the runner's job.same)."""
    from codeckv.measure.reasoning import steps_of

    for row in kept:
        if int(row["steps"]) != steps_of(int(row["index"]), tuple(args.steps)):
            raise ValueError(f"{path}'s problem {row['index']} has {row['steps']} steps, which --steps "
                             f"{' '.join(map(str, args.steps))} does not give it: pass the --steps it was measured "
                             "with")


def run(args: argparse.Namespace) -> None:
    from codeckv.grid import run_grid
    from codeckv.grid.runner import read_rows
    from codeckv.measure.reasoning import check_reasoning
    from codeckv.measure.reasoning_job import ReasoningJob
    from codeckv.measure.reasoning_summary import kld_curve, summarize
    from codeckv.measure.table import format_table, write_csv

    model, context = model_context(args)
    check_reasoning(args.samples, tuple(args.steps), args.budget, context)
    out = Path(args.out or f"out/reasoning-{file_stem(model)}.csv")
    problems_path = sibling(out, "problems")
    _check_kept(read_rows(problems_path) if args.update and problems_path.exists() else [], args, problems_path)
    job = ReasoningJob(model, args.tiers, args.samples, args.seed, tuple(args.steps), args.budget)
    start = time.perf_counter()
    rows = run_grid(job, problems_path, grid_backend(args), args.update)
    if not rows:
        print("nothing measured")
        return
    every = read_rows(problems_path)  # the whole file, kept rows too
    summary, curve = summarize(every), kld_curve(every)
    print(format_table(summary, ["tier", "problems", "accuracy", "accuracy_se", "agreement", "lost", "gained",
                                 "departed", "first_departure", "kld", "kld_se", "top1", "answer_tokens",
                                 "seconds", "stored_vs_bf16"]))
    print(f"seed {args.seed}, steps {' '.join(map(str, args.steps))} in turn, budget {args.budget} tokens; accuracy "
          f"is lm-eval's strict-match (%); agreement, lost and gained against native (llama.cpp's types against its "
          f"f16); took {time.perf_counter() - start:.1f} s")
    write_csv(summary, out)
    write_csv(curve, sibling(out, "curve"))
    paths = write_figures(lambda figures: {"reasoning_accuracy": figures.reasoning_accuracy_figure(summary, model),
                                           "reasoning_kld_curve": figures.reasoning_curve_figure(curve, model)},
                          Path(args.charts or f"out/reasoning-{file_stem(model)}"))
    print(f"wrote {out}, {problems_path}, {sibling(out, 'curve')}" + "".join(f", {p}" for p in paths))
