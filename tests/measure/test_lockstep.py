"""Distribution metrics on a tiny model: png is exactly native (KLD 0, top-1 100%), a lossy tier is not; the
spread over windows is the standard error."""

import math

import pytest
import torch

from codeckv.cache import make_cache
from codeckv.measure.lockstep import compare, kl_divergence, native_reference, score_cache, spread


@pytest.fixture
def windows():
    return torch.randint(0, 128, (3, 48), generator=torch.Generator().manual_seed(1))


def test_png_is_exactly_native_and_a_lossy_tier_is_not(tiny_gemma3, windows):
    reference = native_reference(tiny_gemma3, windows)
    assert reference.logprobs.shape == (3, 23, 128) and reference.prefix == 24
    png = compare(reference, score_cache(tiny_gemma3, reference, make_cache(tiny_gemma3.config, "png")))
    assert png.kld.mean == 0.0 and png.top1_pct.mean == 100.0 and png.delta_nll_pct.mean == 0.0
    assert png.nll == png.nll_native
    lossy = compare(reference, score_cache(tiny_gemma3, reference, make_cache(tiny_gemma3.config, "jpeg-k2")))
    assert lossy.kld.mean > 0 and lossy.kld.se > 0


def test_kl_divergence_matches_its_definition():
    p = torch.log(torch.tensor([[0.5, 0.5, 0.0]]))
    q = torch.log(torch.tensor([[0.25, 0.75, 0.0]]))
    want = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert kl_divergence(p, q).item() == pytest.approx(want)
    assert kl_divergence(q, q).item() == 0.0


def test_spread_is_the_standard_error_over_windows():
    s = spread(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert s.mean == 2.5 and s.se == pytest.approx(torch.tensor([1.0, 2, 3, 4]).std().item() / 2)
    assert math.isnan(spread(torch.tensor([1.0])).se)
