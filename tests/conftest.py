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


def build_tiny_gemma3():
    """A random-weight 6-layer Gemma 3 (full attention on layers 2 and 5, sliding window elsewhere): the hybrid case."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, sliding_window=16, max_position_embeddings=256,
        layer_types=["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2 + ["full_attention"],
    )
    torch.manual_seed(0)
    return Gemma3ForCausalLM(config).eval()


@pytest.fixture
def tiny_gemma3():
    """A fresh tiny hybrid Gemma 3 per test (build_tiny_gemma3)."""
    return build_tiny_gemma3()


@pytest.fixture(scope="session")
def tiny_gemma3_builder():
    """The builder itself, for module-scoped fixtures that build the model once (conftest is not importable by
    name: tests/measure has its own)."""
    return build_tiny_gemma3
