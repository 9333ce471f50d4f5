"""Human-readable text for measured results: bytes, the per-turn stats lines, the model panel.

Pure formatting of numbers that codeckv.measure produced; no measuring happens here.
"""

from __future__ import annotations

import math

from codeckv.measure.side_by_side import Comparison
from codeckv.models import ModelInfo


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _ms(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.1f} ms"


def native_stats_markdown(cmp: Comparison) -> str:
    """The native panel's line: its bytes, prefill and decode latency."""
    run = cmp.native
    return (
        f"**native cache** {human_bytes(run.archive_bytes)} "
        f"({run.archive_bytes / run.bf16_bytes:.0%} of bf16) · prefill {run.prefill_s * 1000:.0f} ms · "
        f"{_ms(run.decode_ms)}/token · {run.tokens_per_s:.1f} tok/s · {len(run.token_ids)} tokens"
    )


def codec_stats_markdown(cmp: Comparison) -> str:
    """The codec panel's line: archive and resident bytes vs bf16, latency vs native, token match, ΔNLL."""
    run = cmp.codec
    first = cmp.first_divergence
    divergence = "never diverged" if first is None else f"first divergence at token {first}"
    return (
        f"**{cmp.tier}** archive {human_bytes(run.archive_bytes)} (**{cmp.ratio_vs_bf16:.1%} of bf16**) · "
        f"resident {human_bytes(run.resident_bytes)} ({run.resident_bytes / run.bf16_bytes:.0%}) · "
        f"prefill {run.prefill_s * 1000:.0f} ms · {_ms(run.decode_ms)}/token ({cmp.latency_ratio:.2f}× native)  \n"
        f"token match **{cmp.token_match:.0%}** ({divergence}) · "
        f"ΔNLL of the turn **{cmp.delta_nll_pct:+.2f}%** ({cmp.nll_codec:.3f} vs {cmp.nll_native:.3f} nats)"
    )


def model_markdown(info: ModelInfo, backend: str) -> str:
    """The model and backend panel."""
    sliding = f", {info.native_only_layers} native-only" if info.native_only_layers else ""
    return (
        f"**{info.name}** · {info.source} (loaded in {info.load_seconds} s) · {len(info.layer_types)} layers "
        f"({info.codec_layers} carry a codec{sliding}) · {info.num_kv_heads} KV heads × head_dim {info.head_dim} · "
        f"{info.dtype} on {info.device} · kernels: {backend} · "
        f"KV bytes/token of a bf16 cache: {info.kv_bytes_per_token_bf16:,}"
    )
