"""Command line: codeckv quality|sweep|needle|ruler|reasoning|inspect|memory|prefill|latency|saved-size|resume|
pca-size|allocate|calibrate|families (python -m codeckv)

Tables on stdout, progress bars on stderr; CSV, JSON and HTML files under out/ unless --out / --charts
say where (the docs' commands that regenerate the committed CSVs pass --out assets/...).
The hub is used as huggingface_hub is told: `--offline` (or HF_HUB_OFFLINE=1) keeps a run off the
network; otherwise a hub id downloads once into the HF cache. Exit status: 0 done, 1 a runtime
error (one line on stderr), 2 a usage error (argparse), 130 interrupted.

One module per command (NAME, HELP, add_arguments, run, and optionally usage_problem); cli/common.py
holds what they share and cli/types.py the argument types. Tier and peer names are resolved here, at the
edge: the measurements take Tier and Peer objects.
"""

from __future__ import annotations

import argparse
import os
import sys

from codeckv import __version__
from codeckv.cli import (
    allocate,
    calibrate,
    families,
    inspect_kv,
    latency,
    memory,
    needle,
    pca_size,
    prefill,
    quality,
    reasoning,
    resume,
    ruler,
    saved_size,
    sweep,
)

COMMANDS = (quality, sweep, inspect_kv, needle, ruler, reasoning, memory, prefill, latency, allocate, saved_size,
            resume, pca_size, calibrate, families)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command, each with the shared --model / --offline options."""
    parser = argparse.ArgumentParser(prog="codeckv", description=__doc__.splitlines()[0],
                                     epilog="codeckv COMMAND --help: that command's options")
    parser.add_argument("--version", action="version", version=f"codeckv {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", default=None, help="smollm2-135m (default), gemma3-270m or a hub id")
    common.add_argument("--offline", action="store_true",
                        help="never touch the network (as HF_HUB_OFFLINE=1): models come from the local caches")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        cmd = sub.add_parser(command.NAME, parents=[common], help=command.HELP,
                             description=command.HELP.replace("%%", "%"))
        command.add_arguments(cmd)
        cmd.set_defaults(run=command.run, usage_problem=getattr(command, "usage_problem", None))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; the exit status (module docstring) is returned, never raised."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        problem = args.usage_problem(args) if args.usage_problem else None
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
