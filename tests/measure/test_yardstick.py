"""llama.cpp's yardstick: KLD and Δp percentiles over every scored position, RMS Δp, the spread over windows."""

import math

import pytest
import torch

from codeckv.measure.lockstep import Reference, Scores
from codeckv.measure.yardstick import KLD_QUANTILES, yardstick


def _reference(nll: torch.Tensor) -> Reference:
    windows = torch.zeros(nll.shape[0], nll.shape[1] + 2, dtype=torch.long)
    return Reference(windows, 1, torch.zeros(*nll.shape, 4), nll)


def test_percentiles_are_those_of_every_position_and_a_rare_large_error_shows_in_the_tail():
    kld = torch.full((2, 500), 0.001)
    kld[1, 7] = 3.0  # one position in a thousand: the mean hides it, the maximum does not
    nll = torch.full((2, 500), 1.0)
    stats = yardstick(_reference(nll), Scores(nll.clone(), kld, torch.ones(2, 500, dtype=torch.bool)))
    assert stats.kld["max"] == pytest.approx(3.0) and stats.kld["median"] == pytest.approx(0.001)
    assert stats.kld["p99"] == pytest.approx(0.001) and stats.kld["p999"] > 0.002, "the tail is seen at 99.9%"
    assert list(stats.kld) == list(KLD_QUANTILES)
    assert stats.dp_mean == 0.0 and stats.dp_rms == 0.0, "the same probability of every actual token"


def test_dp_is_the_probability_of_the_actual_token_minus_natives():
    native = torch.tensor([[math.log(2.0), math.log(4.0)], [math.log(2.0), math.log(2.0)]])  # p = 1/2, 1/4 ...
    tier = torch.tensor([[math.log(4.0), math.log(4.0)], [math.log(2.0), math.log(1.0)]])  # p = 1/4, 1/4; 1/2, 1
    stats = yardstick(_reference(native), Scores(tier, torch.zeros(2, 2), torch.ones(2, 2, dtype=torch.bool)))
    dp = torch.tensor([[-0.25, 0.0], [0.0, 0.5]], dtype=torch.float64)
    assert stats.dp_mean == pytest.approx(float(dp.mean()))
    assert stats.dp_rms == pytest.approx(float(dp.pow(2).mean().sqrt()))
    assert stats.dp["min"] == pytest.approx(-0.25) and stats.dp["max"] == pytest.approx(0.5)
    per_window = dp.mean(1)
    assert stats.dp_se == pytest.approx(float(per_window.std() / math.sqrt(2)))
    columns = stats.columns()
    assert {"kld_p99", "kld_max", "dp_rms", "dp_p75", "dp_se", "dp_rms_se"} <= set(columns)
