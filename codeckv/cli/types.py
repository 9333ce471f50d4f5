"""The argument types of the command line (codeckv/cli/): each turns a string into a checked value or
raises argparse.ArgumentTypeError, which argparse prints as a usage error (exit 2) with the allowed values."""

from __future__ import annotations

import argparse


def bits_list(text: str) -> list[float]:
    """'1,1.5,2' -> [1.0, 1.5, 2.0] (argparse type of --pca-bits)."""
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers (e.g. 1,1.5,2)") from None


def tier_name(text: str) -> str:
    """A preset tier name (argparse type: an unknown name is a usage error listing the allowed ones)."""
    from codeckv.tiers import get_tier

    try:
        return get_tier(text).name
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def run_name(text: str) -> str:
    """A preset tier or a peer name (argparse type: an unknown name is a usage error listing both)."""
    from codeckv.measure.peers import run_for

    try:
        return run_for(text).name
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def positive(text: str) -> int:
    """A whole number >= 1 (argparse type)."""
    return whole(text, 1)


def count(text: str) -> int:
    """A whole number >= 0 (argparse type; 0 = off or the default)."""
    return whole(text, 0)


def whole(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value} is below {low}")
    return value


def token_counts(text: str) -> list[int]:
    """--contexts "1024,4096,8192" -> [1024, 4096, 8192] (argparse type: anything else is a usage error)."""
    try:
        contexts = [int(part) for part in text.split(",")]
    except ValueError:
        contexts = []
    if not contexts or min(contexts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be comma-separated positive token counts, e.g. 1024,4096,8192")
    return contexts
