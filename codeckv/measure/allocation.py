"""Per-layer budgets: how much each layer's error moves the output, and a tier per layer under a total budget.

    sens = fisher_sensitivity(loaded, ["turbo-3", "turbo-4", "int8"])     # one forward + backward, seconds
    sens = layer_sensitivity(loaded, ["turbo-3", "turbo-4", "int8"], windows=2, length=256)  # lockstep KLD, slow
    plan = allocate(sens, budget="turbo-4")        # Allocation: a tier per layer, bytes <= uniform turbo-4's
    cache = make_cache(loaded, plan.tier)          # plan.tier: a per-layer schedule (codeckv/cache/schedule.py)
    rows = compare_allocation(loaded, plan)        # plan vs uniform turbo-4 on the corpus and the docstrings

Sensitivity of layer i to tier t, two ways; neither reads the held-out docstrings (they only judge the plan):

- lockstep (layer_sensitivity): the mean KL(native || probe) of a probe cache that compresses layer i only
  (`schedule("native", {i: t})`), every probe and native fed the first corpus windows in lockstep
  (measure/quality.py, measure/lockstep.py): the KLD itself, at one probe per (layer, rung), so 90 caches for
  smollm2-135m's 30 layers and 3 rungs.
- Fisher (fisher_sensitivity): the calibration's yardstick (codeckv/cache/calibration.py). One forward + backward
  of the PCA calibration windows (the end of the corpus) gives each layer's K, V and g = d(summed next-token
  NLL)/d(K, V); the layer's K, V go through the tier as a cache stores them (a real CodecLayer, every complete
  block archived), and the sensitivity is mean over positions of (g . delta)^2, delta the reconstruction error of
  that position's keys and values, all heads together: the empirical-Fisher estimate delta^T F delta of the
  loss increase, in the units of that yardstick (not nats: the plan's KLD is measured in lockstep afterwards).

Allocation: each layer's cost of tier t is t's steady-state bytes per token (codeckv.cache.steady_state_ratio,
the same for every layer of a model whose full-attention layers share their geometry); the total must stay
within the budget tier's cost on every layer. The predicted KLD of a plan is the sum of its layers' measured
sensitivities (additive for small, independent errors: an assumption the comparison checks). The search is
exact for that sum: a multiple-choice knapsack solved by dynamic programming over the layers and the bytes
spent (a greedy on marginal returns can end below the uniform tier when its last upgrade does not fit; this
cannot, since uniform is one of the plans it weighs). A rung must have a fixed size (PCA tiers' entropy-coded
size depends on the text, so they are refused here: allowed are the per-tensor tiers).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, Cache, DynamicLayer, get_layer_types_and_kwargs

from codeckv.cache import steady_state_ratio
from codeckv.cache.calibration import calibration_windows
from codeckv.cache.layers import CodecLayer
from codeckv.cache.schedule import layers_text, schedule
from codeckv.loaded import LoadedModel
from codeckv.measure.quality import QualityRow, measure_quality
from codeckv.tiers import TIERS, Tier

Progress = Callable[[int, int, str], None]
DEFAULT_LADDER = (TIERS["turbo-3"], TIERS["turbo-4"], TIERS["int8"])
COST_UNITS = 4096  # the allocation counts bytes in 1/4096 of a bf16 layer (the presets' ratios are multiples of 1/64)


@dataclass
class Sensitivity:
    """Per full-attention layer and per rung: the KLD (and ΔNLL, top-1) compressing that layer alone causes."""

    model: str
    head_dim: int
    layers: list[int]  # full-attention layer indices
    ladder: list[Tier]  # rungs, in the order given
    cost: dict[str, float]  # rung name -> steady-state bytes per token / bf16 (per layer)
    score: dict[tuple[int, str], float]  # (layer, rung) -> its sensitivity (`method`: KLD or the Fisher estimate)
    delta_nll_pct: dict[tuple[int, str], float]
    top1_pct: dict[tuple[int, str], float]
    windows: int
    length: int
    method: str = "lockstep"  # "lockstep": kld in nats per token; "fisher": (g . delta)^2, the calibration's units

    def rows(self) -> list[dict]:
        """One row per (layer, rung): what the CSV holds."""
        return [{"layer": layer, "tier": rung.name, "steady_state_ratio": self.cost[rung.name],
                 "method": self.method, "sensitivity": self.score[layer, rung.name],
                 "delta_nll_pct": self.delta_nll_pct[layer, rung.name],
                 "top1_pct": self.top1_pct[layer, rung.name], "windows": self.windows, "tokens": self.length}
                for layer in self.layers for rung in self.ladder]


@dataclass
class Allocation:
    """A tier per full-attention layer whose total cost is within the budget's."""

    budget: Tier
    per_layer: dict[int, Tier]  # full-attention layer -> its rung
    cost: float  # mean steady-state ratio over the layers
    budget_cost: float  # the budget tier's steady-state ratio
    predicted: float  # sum of the chosen rungs' sensitivities
    budget_predicted: float  # the same sum for the budget tier on every layer (when it is a rung, else nan)

    @property
    def tier(self) -> Tier:
        """The plan as a per-layer schedule (every full-attention layer named), for make_cache."""
        return schedule(self.budget, self.per_layer)

    @property
    def text(self) -> str:
        """The plan as the Advanced panel's text, e.g. '0-3:int8, 4-29:turbo-3'."""
        return layers_text({index: tier.name for index, tier in self.per_layer.items()})

    def rows(self, sensitivity: Sensitivity) -> list[dict]:
        """One row per layer: its tier, cost and measured sensitivity."""
        return [{"layer": index, "tier": tier.name, "steady_state_ratio": sensitivity.cost[tier.name],
                 "sensitivity": sensitivity.score[index, tier.name],
                 "sensitivity_at_budget": sensitivity.score.get((index, self.budget.name), math.nan)}
                for index, tier in sorted(self.per_layer.items())]


def fisher_sensitivity(loaded: LoadedModel, ladder: tuple[Tier, ...] = DEFAULT_LADDER, windows: int = 4,
                       length: int = 256) -> Sensitivity:
    """Each full-attention layer's Fisher-weighted reconstruction error under each rung (module docstring)."""
    rungs, cost = _ladder(ladder, loaded.info.head_dim)
    score = fisher_scores(loaded.model, calibration_windows(loaded.tokenizer, windows, length), rungs)
    nan = dict.fromkeys(score, math.nan)
    return Sensitivity(loaded.info.name, loaded.info.head_dim, sorted({layer for layer, _ in score}), rungs, cost,
                       score=score, delta_nll_pct=nan, top1_pct=nan, windows=windows, length=length, method="fisher")


def fisher_scores(model, ids: torch.Tensor, rungs: list[Tier]) -> dict[tuple[int, str], float]:
    """(full-attention layer, rung name) -> mean over positions of (g . delta)^2 on the (N, S) token ids."""
    with torch.inference_mode(False):
        captured = _states_and_gradients(model, ids.clone())  # a clone: ids made in inference mode can't enter autograd
    score = {}
    with torch.inference_mode():
        for layer, (keys, values, g_keys, g_values) in captured.items():
            for rung in rungs:
                keys_hat, values_hat = _coded(rung, keys, values)
                weighted = ((keys_hat - keys) * g_keys).sum(dim=(1, 3)) + ((values_hat - values) * g_values).sum(
                    dim=(1, 3))  # (B, S): g . delta per position, every head and channel
                score[layer, rung.name] = float(weighted.pow(2).mean())
    return score


def _coded(tier: Tier, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, S, D) keys and values as a cache layer of `tier` holds them after a prefill and a flush."""
    layer = CodecLayer(tier)
    layer.update(keys, values)
    layer.flush()
    return layer.keys.float(), layer.values.float()


class _Capturing(DynamicLayer):
    """A full-attention cache layer that keeps the (B, H, S, D) states it was handed, in the autograd graph."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.captured = (key_states, value_states)
        return super().update(key_states, value_states, *args, **kwargs)


def _states_and_gradients(model, ids: torch.Tensor) -> dict[int, tuple[torch.Tensor, ...]]:
    """Per full-attention layer: K, V (B, H, S, D) as the cache sees them and d(summed NLL)/d(K, V), float32."""
    config = model.config.get_text_config(decoder=True)
    kinds, kwargs = get_layer_types_and_kwargs(config)
    layers = [_Capturing() if kind == "full_attention" else DYNAMIC_LAYER_TYPE_MAPPING[kind](**kw)
              for kind, kw in zip(kinds, kwargs)]
    with torch.enable_grad():
        ids = ids.to(model.device)
        embeds = model.get_input_embeddings()(ids).detach().requires_grad_()
        logits = model(inputs_embeds=embeds, cache=Cache(layers=layers), use_cache=True).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten(), reduction="sum")
        full = [i for i, kind in enumerate(kinds) if kind == "full_attention"]
        states = [t for i in full for t in layers[i].captured]
        grads = torch.autograd.grad(loss, states)
    return {index: tuple(t.detach().float() for t in (*states[2 * j : 2 * j + 2], *grads[2 * j : 2 * j + 2]))
            for j, index in enumerate(full)}


def _fixed_cost(tier: Tier, head_dim: int) -> float:
    """A per-tensor tier's steady-state ratio; ValueError for a tier whose size is not fixed per layer."""
    if tier.is_native or tier.joint is not None or tier.per_layer:
        raise ValueError(f"tier '{tier.name}' has no fixed size per layer to allocate with (allowed: per-tensor "
                         "tiers such as turbo-3, turbo-4, int8, jpeg-k8-int8)")
    return steady_state_ratio(tier, head_dim)


def _ladder(tiers, head_dim: int) -> tuple[list[Tier], dict[str, float]]:
    """The rungs as Tiers, each with its fixed cost."""
    ladder = list(tiers)
    if len(ladder) < 2 or len({t.name for t in ladder}) != len(ladder):
        raise ValueError(f"give at least two distinct tiers to choose from (got {[t.name for t in ladder]})")
    return ladder, {t.name: _fixed_cost(t, head_dim) for t in ladder}


def layer_sensitivity(loaded: LoadedModel, ladder: tuple[Tier, ...] = DEFAULT_LADDER, windows: int = 2,
                      length: int = 256, progress: Progress | None = None) -> Sensitivity:
    """Each full-attention layer compressed alone by each rung, against native, on the embedded corpus."""
    rungs, cost = _ladder(ladder, loaded.info.head_dim)
    layers = [i for i, kind in enumerate(loaded.info.layer_types) if kind == "full_attention"]
    probes = {(layer, rung.name): schedule(TIERS["native"], {layer: rung}) for layer in layers for rung in rungs}
    run = measure_quality(loaded, list(probes.values()), windows, length, "corpus", progress=progress)
    by_name = {row.tier: row for row in run.rows}
    rows = {key: by_name[probe.name] for key, probe in probes.items()}
    return Sensitivity(loaded.info.name, loaded.info.head_dim, layers, rungs, cost,
                       score={k: max(r.kld, 0.0) for k, r in rows.items()},
                       delta_nll_pct={k: r.delta_nll_pct for k, r in rows.items()},
                       top1_pct={k: r.top1_pct for k, r in rows.items()}, windows=windows, length=length)


def allocate(sensitivity: Sensitivity, budget: Tier = TIERS["turbo-4"]) -> Allocation:
    """The rung per layer with the least summed sensitivity whose mean cost is <= the budget tier's (exact).

    Dynamic programming over the layers and the bytes spent, in units of 1/COST_UNITS of a bf16 layer:
    each rung's cost rounded up and the budget down, so the plan never spends more than the budget.
    """
    budget_cost = _fixed_cost(budget, sensitivity.head_dim)
    units = {name: math.ceil(cost * COST_UNITS - 1e-6) for name, cost in sensitivity.cost.items()}
    limit = math.floor(budget_cost * COST_UNITS * len(sensitivity.layers) + 1e-6)
    cheapest = min(units, key=units.get)
    if units[cheapest] * len(sensitivity.layers) > limit:
        raise ValueError(f"the budget '{budget.name}' ({budget_cost:.4f} of bf16) is below the cheapest rung "
                         f"'{cheapest}' ({sensitivity.cost[cheapest]:.4f}): add a cheaper tier to the ladder")
    best: dict[int, tuple[float, tuple[Tier, ...]]] = {0: (0.0, ())}  # units spent -> (least kld, rungs so far)
    for layer in sensitivity.layers:
        step: dict[int, tuple[float, tuple[Tier, ...]]] = {}
        for spent, (kld, rungs) in best.items():
            for rung in sensitivity.ladder:
                total = spent + units[rung.name]
                value = kld + sensitivity.score[layer, rung.name]
                if total <= limit and (total not in step or value < step[total][0]):
                    step[total] = (value, (*rungs, rung))
        best = step
    predicted, rungs = min(best.values(), key=lambda entry: entry[0])
    per_layer = dict(zip(sensitivity.layers, rungs))
    cost = sum(sensitivity.cost[t.name] for t in rungs) / len(rungs)
    at_budget = sum(sensitivity.score.get((layer, budget.name), math.nan) for layer in sensitivity.layers)
    return Allocation(budget, per_layer, cost, budget_cost, predicted, at_budget)


def compare_allocation(loaded: LoadedModel, plan: Allocation, windows: int = 4, length: int = 512,
                       progress: Progress | None = None) -> list[QualityRow]:
    """The plan and the uniform budget tier, each against native, on the corpus and on the held-out docstrings."""
    tiers = [plan.budget] if plan.tier == plan.budget else [plan.budget, plan.tier]  # uniform: the plan is the budget
    rows = []
    for source in ("corpus", "docstrings"):
        rows += measure_quality(loaded, tiers, windows, length, source, progress=progress).rows
    return rows
