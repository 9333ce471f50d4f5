"""ans_cpu: the compiled rANS encoder against constriction's bytes, its cost pass against the torch reference.

Where no C compiler is found the library is not built and these tests skip; the references they compare
with are what runs there (tests/cache/test_pca.py checks numpy's coder against constriction).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from codeckv.codecs import pca
from codeckv.codecs.ans import EntropyTable
from kernels.ans_cpu import ans_available, ans_costs, ans_encode, ans_status
from kernels.codes_cpu import DISABLE_VARIABLE

pytestmark = pytest.mark.skipif(not ans_available(), reason=f"no compiled coder here: {ans_status()}")


def _table(width: int, seed: int) -> EntropyTable:
    """A table fitted on Gaussian codes whose scale falls across the columns, classes 1..width-2 (shifts -1..1)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.linspace(8, 0.05, width)
    fitted = EntropyTable.fit((torch.randn(4000, width, generator=g) * scale).round().int())
    return EntropyTable(fitted.probs, fitted.offset, fitted.classes.clamp(1, width - 2))


def test_encode_writes_constrictions_bytes():
    """Streams of a table at shifts -1..1 (a count that is not a multiple of the lanes coded together), escapes at
    both ends of the 16-bit range: each one byte for byte table.encode's."""
    table = _table(37, 0)
    g = torch.Generator().manual_seed(1)
    chunks = list((torch.randn(11, 6, 37, generator=g) * torch.linspace(12, 0.05, 37)).round().int())
    chunks[0][0, 0], chunks[3][5, 36], chunks[3][2, 2], chunks[10][1, 7] = 32767, -32768, 900, -32000
    shifts = [i % 3 - 1 for i in range(len(chunks))]
    low, frequency = (t.reshape(table.probs.shape) for t in table._fixed_point_flat())
    order = table._order(6)
    codes = torch.stack(chunks).reshape(len(chunks), -1).numpy()
    got = ans_encode(codes, order.order, order.classes, np.array(shifts), table.offset.numpy(), low, frequency)
    assert got == [table.encode(c, s) for c, s in zip(chunks, shifts)]
    assert all(torch.equal(table.decode(stream, 6, s), c) for stream, c, s in zip(got, chunks, shifts))


def test_encode_refuses_a_shift_outside_the_models():
    table = _table(20, 2)
    low, frequency = (t.reshape(table.probs.shape) for t in table._fixed_point_flat())
    order = table._order(2)
    codes = np.zeros((5, 40), dtype=np.int32)
    with pytest.raises(ValueError, match="fall outside models"):
        ans_encode(codes, order.order, order.classes, np.array([0, 0, 0, 0, 5]), table.offset.numpy(), low, frequency)


def test_costs_are_the_torch_references_exactly(monkeypatch):
    """Per-row steps and shifts, components beyond the clamp, halves (rounded to even), a NaN and infinities: every
    row's sum is the torch reference's (both are integer sums)."""
    g = torch.Generator().manual_seed(3)
    width = 2 * pca.COST_LIMIT + 3
    classes = torch.randint(3, 9, (45,), generator=g)
    costs = torch.randint(0, 40 << 16, (12 * width,), generator=g)
    y = torch.randn(2, 23, 45, generator=g) * 30
    y[0, 0, :6] = torch.tensor([2.5, -2.5, 3.5, 1e9, -float("inf"), float("nan")])
    steps = torch.rand(23, generator=g) + 0.5
    steps[0] = 1.0  # row 0: the halves are exact
    shifts = torch.randint(-2, 3, (23,), generator=g)
    got = ans_costs(y, steps, shifts, classes, costs, pca.COST_LIMIT)
    y[0, 0, 5] = pca.COST_LIMIT + 1  # what the C makes of a NaN; torch's cast of one is undefined
    monkeypatch.setenv(DISABLE_VARIABLE, "0")
    assert torch.equal(got, pca._row_costs(y, steps, shifts, classes, costs))


def test_costs_refuse_a_shift_outside_the_models():
    width = 2 * pca.COST_LIMIT + 3
    with pytest.raises(ValueError, match="fall outside models"):
        ans_costs(torch.zeros(1, 2, 3), torch.ones(2), torch.tensor([0, 4]), torch.tensor([1, 2, 3]),
                  torch.zeros(4 * width, dtype=torch.int64), pca.COST_LIMIT)


def test_the_pca_coder_writes_the_same_archive_on_either_path(monkeypatch):
    """A layer's chunks (rate control and streams) are the same with the compiled coder and with the references."""
    fitted = _table(30, 4)
    table = EntropyTable(fitted.probs, fitted.offset, fitted.classes.clamp(9, 23))  # every rung's shift -6..6
    coder = pca.LayerCoder(torch.zeros(32), torch.eye(32, 30), torch.eye(30, 32), 0.5, table, 2, 8,
                           pca.Rope.none(8), sink_tokens=0)
    g = torch.Generator().manual_seed(5)
    keys, values = torch.randn(1, 2, 64, 8, generator=g) * 3, torch.randn(1, 2, 64, 8, generator=g) * 2
    compiled = coder.encode(keys, values, 0, 8, coder.budget(3.0, 1))
    monkeypatch.setenv(DISABLE_VARIABLE, "0")
    reference = pca.LayerCoder(*(getattr(coder, f) for f in ("mean", "enc", "dec", "step", "table", "heads",
                                                             "head_dim", "rope", "sink_tokens")))
    again = reference.encode(keys, values, 0, 8, coder.budget(3.0, 1))
    assert [(c.stream, c.rung) for c in again] == [(c.stream, c.rung) for c in compiled]
    assert len({c.rung for c in compiled}) > 1, "the budget should make the rate control pick more than one rung"
    assert ans_status() == f"reference ({DISABLE_VARIABLE}=0)"
