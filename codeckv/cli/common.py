"""What every command of the command line shares: loading the model, progress bars, prompts, chart files."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm

from codeckv.cli.types import count

DEFAULT_PROMPT = "Explain in a few sentences how a key-value cache speeds up text generation in a transformer."


def forward_bar(desc: str, unit: str = "fwd"):
    """A tqdm bar and the (done, total, message) progress callback the measurements call to drive it."""
    bar = tqdm(total=1, desc=desc, unit=unit)

    def progress(done: int, total: int, message: str) -> None:
        bar.total = total
        bar.n = done
        bar.set_postfix_str(message, refresh=False)
        bar.refresh()

    return bar, progress


@contextmanager
def step_bar(total: int, desc: str, unit: str = "it") -> Iterator[Callable[[str], None]]:
    """A tqdm bar of `total` steps; yields progress(message), which shows the message and counts one step."""
    with tqdm(total=total, desc=desc, unit=unit) as bar:

        def progress(message: str) -> None:
            bar.set_postfix_str(message)
            bar.update(1)

        yield progress


def add_grid_arguments(parser: argparse.ArgumentParser) -> None:
    """--threads and --ray, for a command whose grid runs on codeckv/grid/'s runner."""
    parser.add_argument("--threads", type=count, default=0,
                        help="torch CPU threads (default: torch's choice; with --ray, per worker, default 1)")
    parser.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                        help="run the cells on a Ray cluster (pip install 'codeckv[cluster]'): without ADDRESS "
                             "$RAY_ADDRESS or a cluster started here on 127.0.0.1; 'auto' joins the one this node "
                             "is in; host:port another. Rows as the serial run's; each records its node")


def grid_backend(args: argparse.Namespace):
    """The runner's backend --ray / --threads ask for: a Ray cluster, or this process."""
    from codeckv.grid import Local, Ray

    if args.ray is None:
        return Local(args.threads)
    return Ray(args.ray or None, args.threads or 1)


def load(args: argparse.Namespace):
    """Load --model (the embedded default when unset), saying so on stderr: a first load converts or downloads."""
    from codeckv.models import DEFAULT_MODEL, load_model

    print(f"loading {args.model or DEFAULT_MODEL} ...", file=sys.stderr, flush=True)
    return load_model(args.model)


def model_context(args: argparse.Namespace) -> tuple[str, int]:
    """(name, context in tokens) of --model from its config alone: a length past it is refused before the model
    loads, which converts it for minutes the first time."""
    from codeckv.models import DEFAULT_MODEL, context_tokens, model_config

    name = args.model or DEFAULT_MODEL
    return name, context_tokens(model_config(name))


def set_threads(threads: int) -> None:
    """--threads N: torch's CPU threads (0 leaves torch's own choice)."""
    if threads:
        import torch

        torch.set_num_threads(threads)


def file_stem(model_name: str) -> str:
    """A model name as part of a file name (a hub id's '/' becomes '_')."""
    return model_name.replace("/", "_")


def add_prompt_arguments(parser: argparse.ArgumentParser, without_prompt: str) -> None:
    """--prompt / --raw / --context, read by prompt_of."""
    parser.add_argument("--prompt", default=None, help=f"the user's message, a chat turn (default: {without_prompt})")
    parser.add_argument("--raw", action="store_true", help="feed --prompt as raw text, without the chat template")
    parser.add_argument("--context", type=count, default=0, help="use the first N corpus tokens as a raw prompt")


def prompt_of(args: argparse.Namespace, loaded, default_context: int = 0):
    """--context N: the first N corpus tokens as raw ids; --raw: --prompt as raw text; else a chat message.

    Without --prompt: `default_context` corpus tokens if set, else DEFAULT_PROMPT as a chat message.
    """
    context = args.context or (default_context if args.prompt is None else 0)
    if context:
        from codeckv.corpus import corpus_windows

        return corpus_windows(loaded.tokenizer, 1, context)  # (1, N) ids
    text = args.prompt or DEFAULT_PROMPT
    return text if args.raw else [{"role": "user", "content": text}]


def write_figures(make: Callable, out: Path) -> list[Path]:
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
