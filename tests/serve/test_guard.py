"""A failing handler reaches the page as a gr.Error that says what happened and stays until closed."""

import gradio as gr
import pytest

from codeckv.serve.guard import guarded
from codeckv.serve.limits import Deadline


def test_a_request_past_its_budget_says_so_and_the_message_stays():
    @guarded
    def sweep_steps():
        yield "started"
        Deadline(-1.0).check()  # the budget is spent

    steps = sweep_steps()
    assert next(steps) == "started"
    with pytest.raises(gr.Error) as caught:
        next(steps)
    assert "ran past its time budget" in str(caught.value) and "CODECKV_MAX_REQUEST_SECONDS" in str(caught.value)
    assert caught.value.title == "Time budget spent" and caught.value.duration is None, "not a toast that fades"


def test_any_other_failure_is_a_message_too():
    @guarded
    def broken():
        raise RuntimeError("the tensor was on the moon")

    with pytest.raises(gr.Error, match="RuntimeError: the tensor was on the moon") as caught:
        broken()
    assert caught.value.duration is None
