"""Lloyd-Max scale search (codecs/lloyd_search.py): exact nearest-level lookup, exact search sums, and a search
that is no worse than trying every candidate scale on every value, with fewer operations per value."""

from __future__ import annotations

import math

import pytest
import torch

from codeckv.codecs import ALLOWED_BITS, LloydMaxQuant, Rotation, codebook
from codeckv.codecs.lloyd_max import thresholds
from codeckv.codecs.lloyd_search import error_table, nearest_codes, nearest_levels


def _probes(bits: int) -> torch.Tensor:
    """Random values, every threshold and its float32 neighbours, zeros, infinities and huge values."""
    thr = thresholds(bits)
    inf = torch.tensor(math.inf)
    edge = torch.tensor([0.0, -0.0, math.inf, -math.inf, 1e30, -1e30, 3e-39])
    randn = 3 * torch.randn(20_000, generator=torch.Generator().manual_seed(bits))
    return torch.cat([randn, thr, thr.nextafter(inf), thr.nextafter(-inf), edge])


@pytest.mark.parametrize("bits", ALLOWED_BITS)
def test_nearest_lookup_equals_bucketize(bits: int) -> None:
    u = _probes(bits)
    want = torch.bucketize(u, thresholds(bits))
    levels = tuple(codebook(bits).tolist())
    assert torch.equal(nearest_codes(u, levels).long(), want), f"{bits}-bit codes differ from torch.bucketize"
    assert torch.equal(nearest_levels(u, levels), codebook(bits)[want]), f"{bits}-bit levels differ"


@pytest.mark.parametrize("bits, group", [(2, 32), (4, 32), (3, 8), (8, 64)])
def test_search_sums_are_exact_in_float32(bits: int, group: int) -> None:
    """ERRORS is integer-valued and a group's sum stays below 2**24, so any summation order gives the same sum."""
    table, bins = error_table(tuple(codebook(bits).tolist()), (0.5, 1.0, 1.5), group)
    assert table.shape == (bins, 3) and bins == math.ceil(math.sqrt(group) * 64)
    assert torch.equal(table, table.round()) and (table >= 0).all()
    assert group * table.max().item() < 2**24
    assert table.max().item() >= 2**22 / group, "the table should use most of the exact range"


def _exhaustive(x: torch.Tensor, codec: LloydMaxQuant) -> float:
    """Squared error of the old encoder: every candidate scale tried on every value, best per group kept."""
    g = x.reshape(-1, codec.group)
    rms = g.square().mean(-1, keepdim=True).sqrt()
    levels, cut = codebook(codec.bits), thresholds(codec.bits)
    best = torch.full_like(rms, math.inf)
    for multiple in codec.scales:
        s = (rms * multiple).half().float()
        q = levels[torch.bucketize(torch.where(s > 0, g / s, 0.0), cut)] * s
        best = torch.minimum(best, (q - g).square().sum(-1, keepdim=True))
    return best.sum().item()


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_search_is_no_worse_than_trying_every_scale(bits: int) -> None:
    """On rotated KV-like data (random walk + noise + an outlier channel), as measured on the model's real KV."""
    g = torch.Generator().manual_seed(bits)
    x = (0.3 * torch.randn(1, 4, 512, 64, generator=g)).cumsum(2) + torch.randn(1, 4, 512, 64, generator=g)
    x[..., 3] *= 6.0
    y = x @ Rotation().matrix(64)
    codec = LloydMaxQuant(bits=bits)
    searched = (codec.decode(codec.encode(y)) - y).square().sum().item()
    exhaustive = _exhaustive(y, codec)
    assert searched <= exhaustive, f"{bits}-bit: table search + refit {searched:.4f} > exhaustive {exhaustive:.4f}"
    no_refit = LloydMaxQuant(bits=bits, refit=False)
    assert searched < (no_refit.decode(no_refit.encode(y)) - y).square().sum().item(), "the refit must help"
