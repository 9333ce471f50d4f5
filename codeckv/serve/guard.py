"""The app's handlers wrapped so that any failure reaches the browser as a clear gr.Error, never a stack trace.

The message stays on the page until it is closed (Gradio's default toast fades after 10 s, leaving the outputs a
bare "Error"): a long request that ran past its time budget says so to whoever comes back to it.

    @guarded
    def chat_turn(...): ...         # plain functions and generators (streamed handlers) alike
"""

from __future__ import annotations

import functools
import inspect

import gradio as gr

from codeckv.models import ModelUnavailableError
from codeckv.serve.limits import BudgetExceeded, Stopped


def guarded(handler):
    """Show any failure as a clear gr.Error (never a stack trace); the app keeps serving."""

    def explain(err: Exception) -> gr.Error:
        if isinstance(err, gr.Error):
            return err
        if isinstance(err, BudgetExceeded):
            return gr.Error(str(err), duration=None, title="Time budget spent")
        if isinstance(err, Stopped):
            return gr.Error(str(err), duration=None, title="Stopped")
        if isinstance(err, ValueError | ModelUnavailableError):
            return gr.Error(str(err), duration=None)
        return gr.Error(f"{type(err).__name__}: {err}", duration=None)

    if inspect.isgeneratorfunction(handler):

        @functools.wraps(handler)
        def stream(*args, **kwargs):
            try:
                yield from handler(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - every failure becomes a message, none a crash
                raise explain(err) from err

        return stream

    @functools.wraps(handler)
    def call(*args, **kwargs):
        try:
            return handler(*args, **kwargs)
        except Exception as err:  # noqa: BLE001
            raise explain(err) from err

    return call
