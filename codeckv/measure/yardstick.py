"""llama.cpp's whole yardstick for one cache against its native: the tails of KLD and of Δp, not only their means.

    stats = yardstick(reference, scores)     # measure/lockstep.py's Reference and Scores (or llama.cpp's own)
    stats.kld["p99"], stats.dp_rms           # 99th percentile of KLD (nats); RMS of Δp (probability, 0..1)

What `llama-perplexity --kl-divergence` reports beside the mean KLD, over every scored position of every window:
the KLD's maximum, 99.9 / 99 / 95 / 90th percentiles, median, 10 / 5 / 1 / 0.1th percentiles and minimum; and
Δp = p_cache(actual next token) - p_native(actual next token), its mean, the same percentiles (and the 75th and
25th) and its root mean square. "Same top p" is top-1 agreement (Comparison.top1_pct). A mean can hide rare large
errors; the 99.9th percentile and the maximum show them. Means' standard errors are over windows, as everywhere
in codeckv (llama.cpp's are over tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from codeckv.measure.lockstep import Reference, Scores

KLD_QUANTILES = {"max": 1.0, "p999": 0.999, "p99": 0.99, "p95": 0.95, "p90": 0.90, "median": 0.5, "p10": 0.10,
                 "p05": 0.05, "p01": 0.01, "p001": 0.001, "min": 0.0}
DP_QUANTILES = {"max": 1.0, "p999": 0.999, "p99": 0.99, "p95": 0.95, "p90": 0.90, "p75": 0.75, "median": 0.5,
                "p25": 0.25, "p10": 0.10, "p05": 0.05, "p01": 0.01, "p001": 0.001, "min": 0.0}


@dataclass
class Yardstick:
    """The distributions of KLD and Δp over the scored positions (module docstring)."""

    kld: dict[str, float]  # KLD_QUANTILES name -> nats
    dp: dict[str, float]  # DP_QUANTILES name -> probability difference (-1..1)
    dp_mean: float
    dp_se: float  # over windows
    dp_rms: float
    dp_rms_se: float  # over windows (of each window's RMS)

    def columns(self) -> dict[str, float]:
        """Flat CSV columns: kld_max, kld_p999, ..., dp_mean, dp_se, dp_max, ..., dp_rms, dp_rms_se."""
        return {**{f"kld_{k}": v for k, v in self.kld.items()}, "dp_mean": self.dp_mean, "dp_se": self.dp_se,
                **{f"dp_{k}": v for k, v in self.dp.items()}, "dp_rms": self.dp_rms, "dp_rms_se": self.dp_rms_se}


def yardstick(reference: Reference, scores: Scores) -> Yardstick:
    """KLD and Δp of `scores` against `reference`, over every scored position (W x positions)."""
    dp = torch.exp(-scores.nll.double()) - torch.exp(-reference.nll.double())  # (W, positions)
    per_window_rms = dp.pow(2).mean(1).sqrt()
    return Yardstick(
        kld=_quantiles(scores.kld.double(), KLD_QUANTILES),
        dp=_quantiles(dp, DP_QUANTILES),
        dp_mean=float(dp.mean()),
        dp_se=_se(dp.mean(1)),
        dp_rms=float(dp.pow(2).mean().sqrt()),
        dp_rms_se=_se(per_window_rms),
    )


def _quantiles(values: torch.Tensor, names: dict[str, float]) -> dict[str, float]:
    flat = values.reshape(-1)
    got = torch.quantile(flat, torch.tensor(list(names.values()), dtype=flat.dtype))
    return {name: float(v) for name, v in zip(names, got)}


def _se(per_window: torch.Tensor) -> float:
    """Standard error of the mean of per-window values (nan for one window)."""
    n = per_window.numel()
    return float(per_window.std(unbiased=True) / math.sqrt(n)) if n > 1 else math.nan
