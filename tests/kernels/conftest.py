"""Shared checks for the kernel tests: stored tensors equal to the codec's, random KV-like inputs."""

import os

import pytest
import torch

from codeckv.codecs.base import Encoded

# Kernels run on CPU tensors under the interpreter (TRITON_INTERPRET=1, set by tests/conftest.py) and on
# CUDA tensors when a GPU run sets TRITON_INTERPRET=0.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
DEVICE = "cpu" if INTERPRETED or not torch.cuda.is_available() else "cuda"

# Under the interpreter the kernels reproduce the codec bit for bit. A GPU may round a few sums
# differently (fused multiply-adds), moving a value that sits on a decision boundary by one step.
GPU_MISMATCH = 1e-3  # largest fraction of stored bytes / fp16 statistics allowed to differ on a GPU


@pytest.fixture
def random_kv():
    """make(shape, seed=0, device=DEVICE): KV-like data, a random walk along the tokens, noise, one outlier channel."""

    def make(shape: tuple[int, ...], seed: int = 0, device: str = DEVICE) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        x = (0.3 * torch.randn(shape, generator=g)).cumsum(2) + torch.randn(shape, generator=g)
        x[..., 1] *= 8.0
        return x.to(device)

    return make


@pytest.fixture
def assert_same_storage():
    """Check that two Encoded hold the same tensors: names, shapes, dtypes, and values."""

    def check(got: Encoded, want: Encoded) -> None:
        assert got.shape == want.shape and got.dtype == want.dtype
        assert set(got.data) == set(want.data), f"stored tensors {sorted(got.data)} != {sorted(want.data)}"
        for name, w in want.data.items():
            g = got.data[name]
            assert (g.shape, g.dtype) == (w.shape, w.dtype), f"'{name}': {g.shape} {g.dtype} != {w.shape} {w.dtype}"
            if w.dtype in (torch.uint8, torch.float16):
                differ = (g.cpu() != w.cpu()).float().mean().item()
                limit = 0.0 if INTERPRETED else GPU_MISMATCH
                assert differ <= limit, f"'{name}': {differ:.2%} of the stored values differ from the codec's"
            else:  # raw DCT coefficients: float sums in another order, within the dtype's default tolerance
                torch.testing.assert_close(g, w, msg=f"'{name}' differs from the codec's")

    return check
