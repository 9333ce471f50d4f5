"""Measurement fixtures shared by tests/measure: one short sweep and one KV capture per session."""

import pytest

CHAT = [{"role": "user", "content": "Name three colours."}]
TEXT = "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg built a press."


@pytest.fixture(scope="session")
def chat():
    return CHAT


@pytest.fixture(scope="session")
def text():
    return TEXT


@pytest.fixture(scope="session")
def swept(loaded):
    """A two-tier sweep (lossless png, lossy jpeg-k2) with a few tokens past the chat prompt."""
    from codeckv.measure.sweep import sweep
    from codeckv.tiers import TIERS

    calls = []
    result = sweep(loaded, CHAT, [TIERS["png"], TIERS["jpeg-k2"]], max_new_tokens=10, stop_at_eos=False,
                   progress=lambda done, total, message: calls.append((done, total)))
    return result, calls


@pytest.fixture(scope="session")
def capture(loaded):
    from codeckv.measure.inspection import capture_kv

    return capture_kv(loaded, TEXT)
