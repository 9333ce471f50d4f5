"""Tier sweep on one chat prompt: generation-side numbers, one table row per tier (a single sample).

    result = sweep(loaded, [{"role": "user", "content": "Explain KV caches."}], ["png", "turbo-4"], 64)
    result.rows          # SweepRow per tier: bytes, latency ratio, token match, KLD / top-1 / ΔNLL on the reply

Generation reuses measure/side_by_side.py: the native run happens once, and every tier generates
beside it in the same round robin (one token each in turn), so all latencies are measured under the
same load. The quality numbers come from one reply, so they are noisy: measure/quality.py measures
quality on long text with its spread over windows. PSNR comes from measure/inspection.py on the K and V
of the prompt plus the native continuation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from codeckv.cache.calibration import Calibration, calibration_for
from codeckv.loaded import LoadedModel
from codeckv.measure.inspection import capture_kv, layer_errors
from codeckv.measure.runs import Comparison, Prompt, RunStats
from codeckv.measure.side_by_side import prompt_ids, stream_runs
from codeckv.tiers import TIERS, Tier

Progress = Callable[[int, int, str], None]  # (done, total, message), e.g. a tqdm bar or gr.Progress


@dataclass
class SweepRow:
    """One tier on the sweep's prompt, against the shared native run."""

    tier: str
    description: str
    archive_bytes: int  # codec-carrying layers after the turn (a native tier: what the native cache holds)
    bf16_bytes: int  # a bf16 native cache of the same tokens
    ratio_vs_bf16: float
    steady_state_ratio: float  # bytes per archived token / bf16 bytes per token
    stored_vs_bf16: float  # per token seen, kept tokens in the format's bytes (bf16 when raw) / bf16 (Footprint)
    kld: float  # KL(native || tier) on the native reply, nats per token
    top1_pct: float
    nll: float  # native continuation teacher-forced through the tier's cache
    delta_nll_pct: float
    prefill_s: float
    decode_ms: float  # median after one warm-up step
    native_decode_ms: float
    latency_ratio: float  # decode_ms / native_decode_ms, measured interleaved
    token_match: float
    first_divergence: int | None
    psnr_db: float  # mean over codec layers of the K and V PSNR (inf: exact)


@dataclass
class Sweep:
    """The table rows, plus the native run and per-tier comparisons behind them."""

    prompt_tokens: int
    native: RunStats  # the one native run every row is compared with
    comparisons: dict[str, Comparison]  # run label -> Comparison, for per-token charts
    rows: list[SweepRow]


def sweep(
    loaded: LoadedModel,
    prompt: Prompt,
    tiers: list[Tier] | None = None,
    max_new_tokens: int = 64,
    stop_at_eos: bool = True,
    progress: Progress | None = None,
) -> Sweep:
    """Run native once and every tier beside it on `prompt`; one SweepRow per tier, in the order given."""
    tiers = list(TIERS.values()) if tiers is None else tiers
    update = None
    for update in stream_runs(loaded, prompt, tiers, max_new_tokens, stop_at_eos):
        done, total = update.progress
        if progress:
            progress(done, total + len(tiers), f"{update.phase}")
    ids = prompt_ids(loaded, prompt)
    native = next(iter(update.results.values())).native
    capture = capture_kv(loaded, torch.cat([ids[0].cpu(), torch.tensor(native.token_ids)])[None])
    rows = []
    for index, (label, cmp) in enumerate(update.results.items()):
        if progress:
            progress(total + index + 1, total + len(tiers), f"PSNR {label}")
        rows.append(_row(cmp, _mean_psnr(capture, tiers[index], calibration_for(loaded, tiers[index])), tiers[index]))
    return Sweep(ids.shape[1], native, update.results, rows)


def _mean_psnr(capture, tier: Tier, calibration: Calibration | None) -> float:
    errors = [e for e in layer_errors(capture, tier, calibration) if e.codec]
    if not errors:
        return math.inf
    values = [p for e in errors for p in (e.key_psnr_db, e.value_psnr_db)]
    return math.inf if any(math.isinf(p) for p in values) else sum(values) / len(values)


def _row(cmp: Comparison, psnr: float, tier: Tier) -> SweepRow:
    return SweepRow(
        tier=cmp.tier,
        description=cmp.description,
        archive_bytes=cmp.codec.archive_bytes,
        bf16_bytes=cmp.codec.bf16_bytes,
        ratio_vs_bf16=cmp.ratio_vs_bf16,
        steady_state_ratio=cmp.steady_state_ratio,
        stored_vs_bf16=cmp.codec.footprint.stored_ratio(tier.coded),
        kld=cmp.kld,
        top1_pct=cmp.top1_pct,
        nll=cmp.nll_codec,
        delta_nll_pct=cmp.delta_nll_pct,
        prefill_s=cmp.codec.prefill_s,
        decode_ms=cmp.codec.decode_ms,
        native_decode_ms=cmp.native.decode_ms,
        latency_ratio=cmp.latency_ratio,
        token_match=cmp.token_match,
        first_divergence=cmp.first_divergence,
        psnr_db=psnr,
    )


def as_dicts(rows: list[SweepRow]) -> list[dict]:
    return [asdict(r) for r in rows]
