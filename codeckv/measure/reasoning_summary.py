"""The reasoning grid's per-problem rows, summed up per tier and along the generation.

    summary = summarize(problem_rows)     # one dict per tier: accuracy, agreement, flips, departure, KLD, bytes
    curve = kld_curve(problem_rows)       # one dict per tier and CURVE_SPAN-token span: KLD and top-1 there

The rows may come from measure/reasoning.py (ProblemRow, as dicts) or from its CSV (strings): every number is read
with float(). A tier is compared on the problems it and its reference both answered. Every mean has its standard
error over the problems (nan with one); `accuracy` is lm-eval's strict-match, `accuracy_flexible` its
flexible-extract. `agreement` is the share of problems whose strict answers equal the reference's (both invalid
counts as equal); `lost` counts the problems the reference got right and the tier wrong, `gained` the reverse.
`departed` is the share of problems whose greedy tokens left the reference's; `first_departure` the median
position where they did, over those problems. KLD and top-1 are the mean over problems of each problem's mean
over its generated positions, as the quality tables take the mean over windows.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from codeckv.measure.reasoning_tasks.answers import normalized

CURVE_SPAN = 32  # generated tokens a point of the curve spans


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and its standard error (nan, nan for no value; se nan for one)."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
    return statistics.fmean(values), se


def _by_tier(rows: Iterable[dict]) -> dict[str, dict[int, dict]]:
    tiers: dict[str, dict[int, dict]] = {}
    for row in rows:
        tiers.setdefault(str(row["tier"]), {})[int(row["index"])] = row
    return tiers


def summarize(rows: Iterable[dict]) -> list[dict]:
    """One dict per tier, in the rows' order (module docstring)."""
    tiers = _by_tier(rows)
    summary = []
    for tier, problems in tiers.items():
        reference_name = str(next(iter(problems.values()))["reference"])
        reference = tiers.get(reference_name, {})
        shared = sorted(set(problems) & set(reference))
        correct = [100.0 * float(problems[i]["correct"]) for i in problems]
        flexible = [100.0 * float(problems[i]["correct_flexible"]) for i in problems]
        agree = [100.0 * (normalized(str(problems[i]["strict"])) == normalized(str(reference[i]["strict"])))
                 for i in shared]
        lost = sum(int(float(reference[i]["correct"])) and not int(float(problems[i]["correct"])) for i in shared)
        gained = sum(int(float(problems[i]["correct"])) and not int(float(reference[i]["correct"])) for i in shared)
        departures = [int(float(problems[i]["first_departure"])) for i in problems]
        departed = [d for d in departures if d >= 0]
        accuracy, accuracy_se = mean_se(correct)
        accuracy_flexible, accuracy_flexible_se = mean_se(flexible)
        agreement, agreement_se = mean_se(agree)
        kld, kld_se = mean_se([float(problems[i]["kld"]) for i in problems])
        top1, top1_se = mean_se([float(problems[i]["top1"]) for i in problems])
        tokens, tokens_se = mean_se([float(problems[i]["answer_tokens"]) for i in problems])
        summary.append({
            "tier": tier, "reference": reference_name, "problems": len(problems),
            "accuracy": accuracy, "accuracy_se": accuracy_se,
            "accuracy_flexible": accuracy_flexible, "accuracy_flexible_se": accuracy_flexible_se,
            "agreement": agreement, "agreement_se": agreement_se, "lost": lost, "gained": gained,
            "departed": 100.0 * len(departed) / len(departures),
            "first_departure": statistics.median(departed) if departed else math.nan,
            "kld": kld, "kld_se": kld_se, "top1": top1, "top1_se": top1_se,
            "answer_tokens": tokens, "answer_tokens_se": tokens_se,
            "seconds": statistics.fmean(float(problems[i]["seconds"]) for i in problems),
            "stored_vs_bf16": statistics.fmean(float(problems[i]["stored_vs_bf16"]) for i in problems),
            "held_bytes": round(statistics.fmean(float(problems[i]["held_bytes"]) for i in problems)),
        })
    return summary


def _points(text: str) -> list[float]:
    return [float(value) for value in str(text).split(";") if value not in ("", "nan")]


def kld_curve(rows: Iterable[dict]) -> list[dict]:
    """Per tier and CURVE_SPAN-token span of the generation: the mean over the problems that reached the span of
    their KLD and top-1 there, with standard errors, and how many problems reached it. llama.cpp rows (no KLD) are
    left out."""
    curve = []
    for tier, problems in _by_tier(rows).items():
        klds = [_points(row["kld_curve"]) for row in problems.values()]
        top1s = [_points(row["top1_curve"]) for row in problems.values()]
        for span in range(max((len(k) for k in klds), default=0)):
            kld, kld_se = mean_se([k[span] for k in klds if len(k) > span])
            top1, top1_se = mean_se([t[span] for t in top1s if len(t) > span])
            curve.append({"tier": tier, "from": span * CURVE_SPAN, "to": (span + 1) * CURVE_SPAN,
                          "problems": sum(len(k) > span for k in klds), "kld": kld, "kld_se": kld_se,
                          "top1": top1, "top1_se": top1_se})
    return curve
