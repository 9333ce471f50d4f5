"""What one request (and all idle chat sessions together) may cost on a public deployment, set by the operator.

    limits = Limits.from_env()            # CODECKV_MAX_PROMPT_TOKENS, CODECKV_MAX_REQUEST_SECONDS, ...
    deadline = limits.deadline()          # deadline.check() raises BudgetExceeded once the time is up
    stop = StopFlag(); stop.request()     # a Stop button; stop.check() raises Stopped in the running request
    release_memory()                      # after a big request: hand freed memory back to the system
    keep_out_of_collections()             # once, at the app's start: its own objects out of that collection

Every default fits a 2-vCPU / 16 GB Space (README, "Deploying"); a value the operator sets must be a
whole number >= 1.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import os
import time
from dataclasses import dataclass, fields

import torch


class BudgetExceeded(ValueError):
    """A request ran past its time budget; the message says which and how to change it."""


@dataclass(frozen=True)
class Limits:
    """Per-request budgets (environment variable = field name in upper case with a CODECKV_ prefix)."""

    max_prompt_tokens: int = 8192  # chat prompt after the chat template (the embedded model's context)
    max_new_tokens: int = 256  # generated tokens per chat turn or per swept tier
    max_request_seconds: int = 600  # wall time of one request; work stops between forward chunks after it
    max_text_chars: int = 200_000  # a pasted or uploaded text
    max_inspect_tokens: int = 2048  # the Inspect text (every layer's K and V is captured and drawn)
    max_sweep_tokens: int = 4096  # windows x tokens per window of a long-text sweep
    max_needle_tokens: int = 40_000  # prompt tokens of all the cells of a needle grid, summed
    max_ruler_tokens: int = 32_768  # prompt tokens of all the samples of a RULER grid (tasks x samples x lengths)
    max_cache_file_bytes: int = 256 << 20  # an uploaded codec cache file (Chat: resume a saved conversation)
    max_reasoning_tokens: int = 2048  # problems x reply budget of one Reasoning grid (generated tokens, per tier)
    max_memory_tokens: int = 32_000  # prompt tokens of all the turns of one Memory chart, summed
    max_idle_mib: int = 4096  # caches all idle chat sessions hold together (codeckv/serve/sessions.py); LRU past it

    @classmethod
    def from_env(cls) -> Limits:
        values = {}
        for f in fields(cls):
            name = f"CODECKV_{f.name.upper()}"
            raw = os.environ.get(name)
            if raw is None:
                continue
            if not raw.strip().isdigit() or int(raw) < 1:
                raise ValueError(f"{name}={raw!r} must be a whole number >= 1")
            values[f.name] = int(raw)
        return cls(**values)

    def deadline(self) -> Deadline:
        return Deadline(self.max_request_seconds)


class Deadline:
    """The end of a request's time budget."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.end = seconds, time.monotonic() + seconds

    @property
    def passed(self) -> bool:
        return time.monotonic() > self.end

    def check(self) -> None:
        """Raise BudgetExceeded once the budget is spent."""
        if self.passed:
            raise BudgetExceeded(
                f"this request ran past its time budget of {self.seconds:g} s and was stopped "
                "(ask for less work, or raise CODECKV_MAX_REQUEST_SECONDS)"
            )


class Stopped(ValueError):
    """The user stopped the request."""


class StopFlag:
    """A stop request shared between a running request and its Stop button (one per browser session)."""

    def __init__(self) -> None:
        self.requested = False

    def request(self) -> None:
        self.requested = True

    def reset(self) -> None:
        self.requested = False

    def check(self) -> None:
        """Raise Stopped if a stop was requested."""
        if self.requested:
            raise Stopped("stopped: the run was stopped before it finished; nothing was kept")


def keep_out_of_collections() -> None:
    """Take every object alive now out of the garbage collector's view until the process exits: called once the app
    has imported and built what it keeps, so the collection release_memory runs after each request walks that
    request's objects only (app.py's 584k objects at start: 0.33 s a collection before, none after). Unfrozen at
    exit, so the interpreter's last collection finalizes them as it did."""
    gc.freeze()
    atexit.register(gc.unfreeze)


def release_memory() -> None:
    """Collect garbage and return freed memory to the system (CUDA cache; glibc arenas on Linux)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc (macOS, musl): nothing to trim
        pass
