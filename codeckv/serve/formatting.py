"""Human-readable text for measured results: bytes, the per-turn stats lines, the model panel.

Pure formatting of numbers that codeckv.measure produced; no measuring happens here.
"""

from __future__ import annotations

import math

from codeckv.cache import CODES, SHORT_VIEW, VIEW
from codeckv.cache.coded_layer import SHORT_VIEW_TOKENS
from codeckv.cache.footprint import Footprint
from codeckv.cache.kernel_ops import backend_name
from codeckv.loaded import ModelInfo
from codeckv.measure.runs import Comparison, Update
from codeckv.serve.backends import tier_backends


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


ATTENTION_WORDS = {
    CODES: "on the stored codes",
    SHORT_VIEW: f"on a decoded view while short (up to {SHORT_VIEW_TOKENS} tokens; on the stored codes beyond)",
    VIEW: "on a decoded view",
}


def attention_text(counts: dict[str, int], why: str | None = None) -> str:
    """Where attention read a cache's archive, in words: {mode: codec layers} (measure/runs.attention_counts) and
    why some layers read a decoded view. E.g. 'on the stored codes in 29 of 30 layers, on a decoded view in the
    others (layer 29 (pca-8x): ...)'; a peer's own mode is shown as it is."""
    if not counts:
        return "native cache"
    words = [(ATTENTION_WORDS.get(mode, mode), n) for mode, n in counts.items()]
    if len(words) == 1:
        text = words[0][0]
    else:
        parts = [f"{words[0][0]} in {words[0][1]} of {sum(counts.values())} layers"]
        parts += [f"{mode} in {n}" for mode, n in words[1:-1]]
        parts.append(f"{words[-1][0]} in the others" if len(words) == 2 else f"{words[-1][0]} in {words[-1][1]}")
        text = ", ".join(parts)
    return f"{text} ({why})" if why else text


def _ms(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.1f} ms"


def native_stats_markdown(cmp: Comparison) -> str:
    """The native panel's line: what its cache holds and held at most, prefill and decode latency."""
    run = cmp.native
    return (
        f"**native cache** holds {human_bytes(run.held_bytes)} ({run.archive_bytes / run.bf16_bytes:.0%} of bf16, "
        f"{run.footprint.tokens:,} tokens), peak {human_bytes(run.peak_held_bytes)} this turn · prefill of "
        f"{run.prompt_tokens:,} new tokens {run.prefill_s * 1000:.0f} ms · {_ms(run.decode_ms)}/token · "
        f"{run.tokens_per_s:.1f} tok/s · {len(run.token_ids)} tokens"
    )


def tokens_held(fp: Footprint) -> str:
    """'1,984 archived + 41 raw (4 sinks, 0 window, 37 tail)': the token counts behind a measured ratio."""
    raw = fp.sink_tokens + fp.window_tokens + fp.tail_tokens
    return (f"{fp.archived_tokens:,} archived + {raw:,} raw ({fp.sink_tokens} sinks, {fp.window_tokens} window, "
            f"{fp.tail_tokens} tail)")


def raw_until_text(raw_until: list[tuple[int | None, int]]) -> str:
    """When a codec cache's layers start archiving (measure/runs.raw_until_counts), e.g. 'raw until 2,048 tokens' or
    'raw until 32 tokens in 29 of 30 layers, raw until 2,048 tokens in 1'; '' for a native cache."""
    def phrase(n: int | None) -> str:
        if n is None:
            return "raw at every length"
        return "archiving from the first unit" if n == 0 else f"raw until {n:,} tokens"

    if len(raw_until) <= 1:
        return "".join(phrase(n) for n, _ in raw_until)
    (n, count), *others = raw_until
    total = sum(layers for _, layers in raw_until)
    return ", ".join([f"{phrase(n)} in {count} of {total} layers", *(f"{phrase(m)} in {c}" for m, c in others)])


def steady_state(ratio: float) -> str:
    """The steady-state ratio, or why there is none yet."""
    return "n/a until a block is archived" if math.isnan(ratio) else f"**{ratio:.1%}**"


def codec_stats_markdown(cmp: Comparison) -> str:
    """The codec panel's lines: memory held and its peak, bytes per token, latency vs native, KLD / top-1 / ΔNLL."""
    run, native = cmp.codec, cmp.native
    first = cmp.first_divergence
    divergence = "never diverged" if first is None else f"first divergence at token {first}"
    if any(layer.archived_tokens for layer in run.footprint.layers):
        attention = attention_text(run.attention, run.view_reason)
    else:  # every layer holds its tokens as the native cache does
        attention = "on the raw tokens (nothing archived)"
    return (
        f"**{cmp.tier}** holds **{human_bytes(run.held_bytes)}** now (**{run.held_bytes / native.held_bytes:.2f}×** "
        f"the native cache; {raw_until_text(run.raw_until)}), peak {human_bytes(run.peak_held_bytes)} this turn "
        f"(native {human_bytes(native.peak_held_bytes)}) · attention {attention} · archive "
        f"{human_bytes(run.archive_bytes)} = **{cmp.ratio_vs_bf16:.1%} of bf16** ({tokens_held(run.footprint)}) · "
        f"steady state {steady_state(cmp.steady_state_ratio)} of bf16 per archived token  \n"
        f"prefill {run.prefill_s * 1000:.0f} ms ({run.prefill_path}) · {_ms(run.decode_ms)}/token "
        f"({cmp.latency_ratio:.2f}× native)  \n"
        f"on the native reply: KL divergence **{cmp.kld:.4f}** nats/token · top-1 agreement **{cmp.top1_pct:.1f}%** · "
        f"ΔNLL {cmp.delta_nll_pct:+.2f}% · greedy token match **{cmp.token_match:.0%}** ({divergence})"
        + (f"  \nalong its own reply (native fed its tokens): KL divergence **{cmp.own_kld:.4f}** nats/token · "
           f"top-1 agreement **{cmp.own_top1_pct:.1f}%**" if cmp.own_kld == cmp.own_kld else "")
    )


def session_markdown(session, cmp: Comparison) -> str:
    """A line before the codec stats: the session's caches were evicted while idle, or rebuilt from their archive."""
    if session.notice is not None:
        return (f"*This session's {session.notice}; this turn prefilled the conversation again "
                f"({cmp.codec.prompt_tokens:,} tokens).*  \n")
    if session.restore_seconds:
        return (f"*Held at rest between turns (archive and raw tokens only); the decoded view was rebuilt from the "
                f"archive in {session.restore_seconds * 1000:.0f} ms.*  \n")
    return ""


def model_markdown(info: ModelInfo) -> str:
    """The model and backend panel: the model, then per tier the path each kernel op takes and why."""
    sliding = f", {info.sliding_layers} of them sliding windows" if info.sliding_layers else ""
    sliding += f", {info.native_only_layers} native-only" if info.native_only_layers else ""
    rows = "\n".join(
        f"| {name} | {paths['encode']} | {paths['decode']} | {paths['attention']} |"
        for name, paths in tier_backends(info.device, info.head_dim, info.dtype).items()
    )
    return (
        f"**{info.name}** · {info.source} (loaded in {info.load_seconds} s) · {len(info.layer_types)} layers "
        f"({info.codec_layers} carry a codec{sliding}) · {info.num_kv_heads} KV heads × head_dim {info.head_dim} · "
        f"{info.dtype} on {info.device} · kernels: {backend_name(info.device)} · "
        f"KV bytes/token of a bf16 cache: {info.kv_bytes_per_token_bf16:,}\n\n"
        "| tier | encode (archiving a block) | decode (the decoded view) | attention on the codes "
        "(materialization-free) |\n|---|---|---|---|\n" + rows
    )


def progress_markdown(update: Update) -> str:
    """What a turn is doing while it streams."""
    done, total = update.progress
    return {
        "prefill": f"prefilling the prompt… ({done}/{total} steps)",
        "generating": "generating…",
        "scoring": "scoring the native reply through the codec cache (KL divergence, top-1, ΔNLL)…",
    }.get(update.phase, "…")


def stopped_markdown(update: Update | None, side: str) -> str:
    """A stopped turn: what each side had done; nothing was scored."""
    if update is None:
        return "**stopped**"
    panel = update.native if side == "native" else update.codec
    if update.phase == "prefill":
        done, total = update.progress
        return f"**stopped** while prefilling the prompt ({done} steps done); nothing generated or scored"
    return f"**stopped** after {len(panel.token_ids)} generated tokens; the turn was not scored"


def _plus_minus(mean: float, se: float, digits: int) -> str:
    return f"{mean:.{digits}f}" + ("" if math.isnan(se) else f" ± {se:.{digits}f}")


def quality_table(rows, absent: list[str] = ()) -> dict:
    """Long-text quality rows (measure/quality.py) as a display table: means ± standard errors.

    A peer that could not run (`absent`, one line each) gets a row of its own saying why.
    """
    headers = ["tier", "× bf16 at this length", "× bf16 steady state", "held at run time", "attention",
               "KLD (nats/token)", "KLD 99th percentile", "top-1 agreement %", "ΔNLL %"]
    data = [[r.tier if r.reference == "native" else f"{r.tier} (vs {r.reference})", round(r.ratio_vs_bf16, 4),
             round(r.steady_state_ratio, 4), human_bytes(r.held_bytes), attention_text(r.attention),
             _plus_minus(r.kld, r.kld_se, 5), round(r.yardstick.kld["p99"], 5), _plus_minus(r.top1_pct, r.top1_se, 2),
             _plus_minus(r.delta_nll_pct, r.delta_nll_se, 3)] for r in rows]
    data += [[line.split(":", 1)[0], "", "", "", line.split(":", 1)[1].strip(), "", "", "", ""] for line in absent]
    return {"headers": headers, "data": data}


def sweep_table(rows) -> dict:
    """One-prompt sweep rows (measure/sweep.py) as a display table."""
    headers = ["tier", "× bf16", "× bf16 steady state", "KLD", "top-1 %", "ΔNLL %", "decode ms", "× native",
               "token match", "first divergence"]
    data = [[r.tier, round(r.ratio_vs_bf16, 4), round(r.steady_state_ratio, 4), round(r.kld, 5), round(r.top1_pct, 1),
             round(r.delta_nll_pct, 2), round(r.decode_ms, 1), round(r.latency_ratio, 3), round(r.token_match, 3),
             r.first_divergence] for r in rows]
    return {"headers": headers, "data": data}


def inspect_summary(view, tier: str, layer: int, head: int) -> str:
    """One line under the Inspect charts: which tokens went through the codec, and the layer's errors."""
    start, end = view.head.archived
    errors = view.layers[layer]
    kept = view.head.kept
    pressed = "" if kept is None else (
        f"Its press kept {int(kept.sum()):,} of the {len(view.tokens):,} tokens in this head ({errors.kept_pct:.0f}% "
        f"over the layer's heads); the evicted ones are blank in the reconstruction, the errors are over the kept. ")
    coded = ("" if end <= start else
             f"tokens {start}–{end} of {len(view.tokens)} went through the codec (the rest stays raw). ")
    return (
        f"**{tier}** on layer {layer}, head {head}: {coded}{pressed}Layer {layer}: K PSNR {errors.key_psnr_db:.1f} dB, "
        f"V PSNR {errors.value_psnr_db:.1f} dB, attention-output error {errors.attention_rel_error:.2%}."
    )
