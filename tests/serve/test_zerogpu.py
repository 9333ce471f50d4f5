"""serve/zerogpu.py: handlers go through spaces.GPU when `spaces` imports (a fake module here), unchanged otherwise."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from codeckv.serve.service import INSPECT_GPU_SECONDS, LONG_GPU_SECONDS


@pytest.fixture
def zerogpu_with(monkeypatch):
    """zerogpu(fake): codeckv.serve.zerogpu re-imported with `fake` as the `spaces` module (None: not installed)."""

    def load(fake):
        monkeypatch.setitem(sys.modules, "spaces", fake)
        import codeckv.serve.zerogpu

        return importlib.reload(codeckv.serve.zerogpu)

    yield load
    monkeypatch.undo()
    import codeckv.serve.zerogpu

    importlib.reload(codeckv.serve.zerogpu)


def _fake_spaces(calls: list):
    """A stand-in for the `spaces` package: GPU(duration=...) records each call's duration, then runs the handler."""
    fake = types.ModuleType("spaces")

    def GPU(duration=60):  # noqa: N802 - the real package's name
        def wrap(handler):
            def run(*args, **kwargs):
                calls.append(duration(*args, **kwargs) if callable(duration) else duration)
                return handler(*args, **kwargs)

            return run

        return wrap

    fake.GPU = GPU
    return fake


def handler(message: str, max_new_tokens: int) -> str:
    return f"{message}:{max_new_tokens}"


def test_without_spaces_the_handler_is_returned_unchanged(zerogpu_with):
    zerogpu = zerogpu_with(None)  # `import spaces` raises ImportError
    assert not zerogpu.available()
    assert zerogpu.gpu(duration=30)(handler) is handler
    assert zerogpu.gpu(duration=lambda *args: 10)(handler) is handler


def test_with_spaces_the_duration_is_sized_per_request(zerogpu_with):
    calls = []
    zerogpu = zerogpu_with(_fake_spaces(calls))
    assert zerogpu.available()
    wrapped = zerogpu.gpu(duration=lambda message, tokens: zerogpu.estimate_seconds(forwards=4 * tokens))(handler)
    assert wrapped is not handler
    assert wrapped("hi", 8) == "hi:8" and wrapped("long", 256) == "long:256"
    assert calls == [zerogpu.estimate_seconds(32), zerogpu.estimate_seconds(1024)]
    assert calls[0] < calls[1] <= zerogpu.MAX_SECONDS, "a longer request asks for more time, within the cap"
    fixed = zerogpu.gpu(duration=45)(handler)
    assert fixed("x", 1) == "x:1" and calls[-1] == 45


def test_generators_stream_through_the_wrapper(zerogpu_with):
    calls = []
    zerogpu = zerogpu_with(_fake_spaces(calls))

    def stream(n):
        yield from range(n)

    assert list(zerogpu.gpu(duration=20)(stream)(3)) == [0, 1, 2] and calls == [20]


@pytest.mark.parametrize("forwards, expected", [(0, "base"), (10**6, "cap")])
def test_estimate_is_clamped(forwards, expected):
    from codeckv.serve import zerogpu

    want = zerogpu.MIN_SECONDS if expected == "base" else zerogpu.MAX_SECONDS
    assert zerogpu.estimate_seconds(forwards) == want


@pytest.mark.parametrize("bad", [0, -5, "60"])
def test_invalid_durations_are_refused(bad):
    from codeckv.serve.zerogpu import gpu

    with pytest.raises(ValueError, match="duration"):
        gpu(duration=bad)


def test_a_chat_turn_asks_for_a_slot_sized_by_its_new_tokens():
    from codeckv.serve.service import chat_gpu_seconds
    from codeckv.serve.zerogpu import MAX_SECONDS, MIN_SECONDS

    short = chat_gpu_seconds("hi", None, None, "m", "turbo-4", 8)
    long = chat_gpu_seconds("hi", None, None, "m", "turbo-4", 256)
    assert MIN_SECONDS <= short < long <= MAX_SECONDS
    assert chat_gpu_seconds("hi", None, None, "m", "t", "10**9") == chat_gpu_seconds("hi", None, None, "m", "t", 256)


TAB_MODULES = ("tabs.inspect", "tabs.long_context", "tabs.reasoning", "tabs.memory", "tabs.sweep")


def test_the_app_handlers_go_through_spaces_gpu(zerogpu_with, monkeypatch):
    """With `spaces` importable, the model-running handlers of app.py and of its tab modules each ask spaces.GPU for
    a slot first."""
    import gradio as gr

    calls: list = []
    zerogpu_with(_fake_spaces(calls))
    for module in TAB_MODULES:
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.delitem(sys.modules, "app", raising=False)
    app = importlib.import_module("app")
    inspect_tab, long_context, reasoning = (importlib.import_module(m) for m in TAB_MODULES[:3])
    with pytest.raises(gr.Error, match="empty"):
        list(app.chat_turn("", None, None, "smollm2-135m", "turbo-4", 8, False, None))
    for handler, args in [(inspect_tab.inspect_kv, ("", "smollm2-135m", "turbo-4")),
                          (long_context.run_needle, ([], [], [], "smollm2-135m")),
                          (reasoning.run_reasoning, (0, [], 32, [], "smollm2-135m"))]:
        with pytest.raises(gr.Error):
            result = handler(*args)
            list(result) if hasattr(result, "__next__") else None
    assert calls[0] == app.chat_gpu_seconds("", None, None, "m", "t", 8)
    assert calls[1:] == [INSPECT_GPU_SECONDS, LONG_GPU_SECONDS, LONG_GPU_SECONDS]
    for module in ("app", *TAB_MODULES):  # the next import builds the app without the fake
        monkeypatch.delitem(sys.modules, module)
