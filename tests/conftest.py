"""Shared test set-up: offline, Triton through its interpreter on CPU, one model load per session."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel import; a GPU run sets TRITON_INTERPRET=0
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.manual_seed(0)


@pytest.fixture(scope="session")
def loaded():
    """The embedded default model, loaded once (converted on the first run, then read from the copy)."""
    from codeckv.models import load_model

    return load_model()
