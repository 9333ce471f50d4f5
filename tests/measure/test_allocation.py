"""Per-layer allocation (codeckv/measure/allocation.py): the greedy on measured sensitivities, under the budget."""

import itertools
import math

import pytest
import torch

from codeckv.cache import steady_state_ratio
from codeckv.custom_tier import custom_tier
from codeckv.measure.allocation import Sensitivity, allocate
from codeckv.tiers import TIERS

LADDER = [TIERS[name] for name in ("turbo-3", "turbo-4", "int8")]
COST = {t.name: steady_state_ratio(t, 64) for t in LADDER}


def _sensitivity(kld: dict[int, tuple[float, float, float]]) -> Sensitivity:
    """Synthetic sensitivities: layer -> KLD under (turbo-3, turbo-4, int8)."""
    table = {(layer, t.name): value for layer, values in kld.items() for t, value in zip(LADDER, values)}
    return Sensitivity("synthetic", 64, sorted(kld), LADDER, COST, table, dict.fromkeys(table, 0.0),
                       dict.fromkeys(table, 100.0), windows=1, length=64)


def _exhaustive(sens: Sensitivity, budget: float) -> float:
    """The least summed KLD over every assignment within the budget (small cases only)."""
    best = math.inf
    for choice in itertools.product(LADDER, repeat=len(sens.layers)):
        if sum(COST[t.name] for t in choice) <= budget * len(sens.layers) * (1 + 1e-9):
            best = min(best, sum(sens.score[layer, t.name] for layer, t in zip(sens.layers, choice)))
    return best


def test_the_costs_are_ordered_as_the_ladder():
    assert COST["turbo-3"] < COST["turbo-4"] < COST["int8"]


def test_a_sensitive_layer_gets_the_bits_a_robust_layer_gives_up():
    """int8 on one layer costs what turbo-3 saves on 4.25 others (0.5625 - 0.297 vs 0.297 - 0.234 of bf16)."""
    sens = _sensitivity({0: (0.2, 0.05, 0.001), **dict.fromkeys(range(1, 6), (0.004, 0.002, 0.0))})
    plan = allocate(sens, TIERS["turbo-4"])
    assert plan.per_layer[0].name == "int8" and {plan.per_layer[i].name for i in range(1, 6)} == {"turbo-3"}
    assert plan.cost <= plan.budget_cost * (1 + 1e-9), "the plan stays within the budget"
    assert plan.predicted < plan.budget_predicted
    assert plan.predicted == pytest.approx(0.001 + 5 * 0.004)
    assert plan.text == "0:int8, 1-5:turbo-3"
    assert plan.tier.tier_at(0) == TIERS["int8"] and plan.tier.tier_at(3) == TIERS["turbo-3"]


@pytest.mark.parametrize("seed", range(6))
def test_the_allocation_is_the_exhaustive_optimum(seed):
    import random

    rng = random.Random(seed)
    sens = _sensitivity({layer: tuple(sorted((rng.uniform(0, 0.1) for _ in range(3)), reverse=True))
                         for layer in range(6)})
    plan = allocate(sens, TIERS["turbo-4"])
    assert plan.cost <= plan.budget_cost * (1 + 1e-9)
    best = _exhaustive(sens, plan.budget_cost)
    assert plan.predicted == pytest.approx(best, rel=1e-12), "the least summed KLD within the budget"
    assert plan.predicted <= plan.budget_predicted + 1e-12, "never worse than uniform turbo-4"
    assert sum(sens.score[layer, t.name] for layer, t in plan.per_layer.items()) == pytest.approx(plan.predicted)


def test_uniform_sensitivities_keep_the_budget_tier():
    sens = _sensitivity(dict.fromkeys(range(4), (0.03, 0.01, 0.009)))
    plan = allocate(sens, TIERS["turbo-4"])
    assert {t.name for t in plan.per_layer.values()} == {"turbo-4"} and plan.tier == TIERS["turbo-4"]


@pytest.mark.parametrize("budget, match", [
    (TIERS["pca-8x"], "no fixed size per layer"),
    (TIERS["native"], "no fixed size per layer"),
    (custom_tier(bits=2), "below the cheapest rung 'turbo-3'"),
])
def test_a_budget_that_cannot_be_met_is_refused(budget, match):
    with pytest.raises(ValueError, match=match):
        allocate(_sensitivity({0: (0.1, 0.05, 0.0)}), budget)


def test_a_ladder_must_be_tiers_of_a_fixed_size():
    from codeckv.measure.allocation import _ladder

    with pytest.raises(ValueError, match="tier 'pca-16x' has no fixed size"):
        _ladder([TIERS["turbo-3"], TIERS["pca-16x"]], 64)
    with pytest.raises(ValueError, match="at least two distinct tiers"):
        _ladder([TIERS["turbo-3"], TIERS["turbo-3"]], 64)


def test_fisher_scores_rank_the_rungs_by_their_error_on_every_full_attention_layer(tiny_gemma3):
    from codeckv.measure.allocation import fisher_scores

    ids = torch.randint(0, 128, (2, 64), generator=torch.Generator().manual_seed(0))
    scores = fisher_scores(tiny_gemma3, ids, [TIERS["png"], *LADDER])
    assert sorted({layer for layer, _ in scores}) == [2, 5], "sliding-window layers keep their native cache"
    for layer in (2, 5):
        png, turbo3, turbo4, int8 = (scores[layer, name] for name in ("png", "turbo-3", "turbo-4", "int8"))
        assert png == 0.0, "a lossless tier changes nothing"
        assert turbo3 > turbo4 > int8 > 0, f"layer {layer}: fewer bits, more loss"


def test_lockstep_sensitivity_probes_every_layer_alone(loaded):
    """One probe cache per (layer, tier), each compressing that layer only, scored in one lockstep run."""
    from codeckv.measure.allocation import layer_sensitivity

    sens = layer_sensitivity(loaded, [TIERS["int8"], TIERS["jpeg-k2"]], windows=1, length=48)  # int8: 32-token units
    assert sens.layers == list(range(30)) and len(sens.score) == 60 and sens.method == "lockstep"
    coarse, fine = (sum(sens.score[layer, name] for layer in sens.layers) for name in ("jpeg-k2", "int8"))
    assert coarse > fine > 0, "keeping 2 of 8 DCT frequencies moves the output more than 8-bit codes"
    assert all(0 <= sens.top1_pct[key] <= 100 for key in sens.score)
