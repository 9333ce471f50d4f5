"""ZeroGPU: run a handler on a Hugging Face ZeroGPU slot when the `spaces` package is there, unchanged elsewhere.

    from codeckv.serve.zerogpu import estimate_seconds, gpu    # in app.py, before anything touches CUDA

    @gpu(duration=lambda message, *rest: estimate_seconds(forwards=4 * int(rest[4])))
    def chat_turn(message, native_chat, codec_chat, model_name, tier_name, max_new_tokens, ...): ...

On a ZeroGPU Space, `spaces.GPU(duration=...)` attaches a GPU to each call of the handler and frees it
when the call (or the generator) ends. `duration` is the most seconds the call may take, and a smaller
request is scheduled sooner; it is a number or a callable that `spaces` calls with the handler's own
arguments, so each request asks for what it needs. Anywhere else (a CPU Space, Docker, a laptop, the
tests) `spaces` is absent and `gpu(...)` returns the handler itself; where `spaces` is installed but the
hardware is not ZeroGPU, `spaces.GPU` does nothing.

`spaces` patches torch's CUDA when it is imported, so this module imports it at once and imports nothing
else: import it first in app.py. The model is loaded on "cuda" at start-up as on any GPU (bf16,
codeckv.models), and ZeroGPU moves it onto the GPU it attaches.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

try:  # must run before anything initialises CUDA: ZeroGPU patches torch on import
    import spaces
except ImportError:
    spaces = None

F = TypeVar("F", bound=Callable)

DEFAULT_SECONDS = 60  # spaces.GPU's own default
MAX_SECONDS = 120  # the longest call a Space visitor may ask for here
MIN_SECONDS = 15  # model hand-over, prefill, tokenization: the floor of any request


def available() -> bool:
    """True when `spaces` is importable, i.e. gpu() wraps handlers with spaces.GPU."""
    return spaces is not None


def estimate_seconds(forwards: int, seconds_per_forward: float = 0.05, base: float = MIN_SECONDS,
                     cap: float = MAX_SECONDS) -> int:
    """A duration for `forwards` model forwards (one per generated or teacher-forced token, per cache).

    base + forwards * seconds_per_forward, clamped to [base, cap], in whole seconds. The default cost per
    forward is an allowance for a small model stepping one token at a time on one GPU, to be revised with
    the decode ms/token that scripts/gpu_check.sh measures.
    """
    if forwards < 0:
        raise ValueError(f"estimate_seconds: forwards={forwards} must be >= 0")
    return math.ceil(min(cap, base + forwards * seconds_per_forward))


def gpu(duration: float | Callable[..., float] = DEFAULT_SECONDS) -> Callable[[F], F]:
    """Decorator: `spaces.GPU(duration=duration)` when `spaces` is importable, else the function unchanged.

    duration: seconds, or a callable of the handler's arguments returning seconds (module docstring).
    """
    if not (callable(duration) or (isinstance(duration, int | float) and duration > 0)):
        raise ValueError(f"gpu: duration={duration!r} must be positive seconds or a callable returning them")

    def wrap(handler: F) -> F:
        if spaces is None:
            return handler
        return spaces.GPU(duration=duration)(handler)

    return wrap
