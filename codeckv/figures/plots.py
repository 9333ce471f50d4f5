"""Plotly figures from measure/ results, in one theme that reads well on slides.

    fig = pareto_figure(result.rows)          # measure/sweep.py rows
    fig = kv_heatmap_figure(view.head, "key") # measure/inspection.py
    fig.write_html("pareto.html", include_plotlyjs=True)   # standalone, works offline

Every builder returns a `go.Figure` titled, with units on its axes, styled by `themed`.
No computation happens here beyond picking fields and a Pareto front.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from codeckv.codecs.vllm_tq_values import TQValues
from codeckv.figures.labels import PLOT_AREA_PX, legend_rows, place_labels
from codeckv.measure.inspection import ChannelSpectrum, HeadView, LayerError, Spectrum
from codeckv.measure.llamacpp import LLAMACPP_PEERS
from codeckv.measure.peers import PEERS
from codeckv.measure.quality import stored_vs_bf16
from codeckv.tiers import get_tier

FONT = "Inter, Helvetica Neue, Arial, sans-serif"
NATIVE_COLOR = "#6b7280"  # grey: the native reference everywhere
KEY_COLOR = "#2563eb"  # blue: keys
VALUE_COLOR = "#ea580c"  # orange: values
ACCENT_COLOR = "#059669"  # green: a third series (attention output)
PEER_COLOR = "#be185d"  # magenta, open diamonds: the peers (transformers' QuantizedCache, codeckv/measure/peers.py)
LLAMACPP_COLOR = "#c2410c"  # orange, open squares: llama.cpp's KV types (codeckv/measure/llamacpp.py)
FORMAT_COLOR = "#0891b2"  # teal, stars: the engines' formats (FP8, FP4)
PRESS_COLOR = "#15803d"  # green, down triangles: presses; filled hexagons: a press over a codec
VLLM_COLOR = "#7c3aed"  # violet, pentagons: vLLM's TurboQuant presets (codecs/vllm_tq_keys.py, vllm_tq_values.py)
CODEC_COLORS = ["#2563eb", "#ea580c", "#059669", "#9333ea", "#dc2626", "#0891b2", "#ca8a04", "#db2777", "#4d7c0f"]

TEMPLATE = go.layout.Template(
    layout=go.Layout(
        font=dict(family=FONT, size=16, color="#111827"),
        title=dict(font=dict(size=22), x=0.02, xanchor="left"),
        colorway=CODEC_COLORS,
        paper_bgcolor="white",
        plot_bgcolor="white",
        margin=dict(l=80, r=30, t=80, b=70),
        xaxis=dict(showgrid=True, gridcolor="#e5e7eb", zeroline=False, linecolor="#9ca3af", ticks="outside"),
        yaxis=dict(showgrid=True, gridcolor="#e5e7eb", zeroline=False, linecolor="#9ca3af", ticks="outside"),
        legend=dict(bgcolor="rgba(255,255,255,0.8)", bordercolor="#e5e7eb", borderwidth=1),
        hoverlabel=dict(font=dict(family=FONT, size=14)),
    )
)


def themed(fig: go.Figure, title: str, x_title: str | None = None, y_title: str | None = None) -> go.Figure:
    """Apply TEMPLATE, the title and (for single-axis figures) the axis titles."""
    fig.update_layout(template=TEMPLATE, title_text=title)
    if x_title is not None:
        fig.update_xaxes(title_text=x_title)
    if y_title is not None:
        fig.update_yaxes(title_text=y_title)
    return fig


def _dicts(rows: Sequence) -> list[dict]:
    """Sweep rows as dicts, whether SweepRow dataclasses or plain dicts."""
    return [dataclasses.asdict(r) if dataclasses.is_dataclass(r) else dict(r) for r in rows]


def _finite(value: float) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both x and y (lower is better), sorted by x."""
    order = sorted(range(len(points)), key=lambda i: points[i])
    front, best = [], math.inf
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


# y metric of the Pareto chart -> (axis title, hover format, smallest cap, values above this are "broken");
# a loss, lower is better, capped so a broken tier does not flatten the rest
PARETO_METRICS = {
    "kld": ("KL divergence from native (nats / token)", "KLD %{customdata[1]:.4f} nats", 0.02, 0.5),
    "delta_nll_pct": ("ΔNLL vs native (%)", "ΔNLL %{customdata[1]:.2f} %", 10.0, 50.0),
}
# y metrics where higher is better, on a fixed 0-100 axis: RULER's score averaged over tasks (figures/long_context.py)
PARETO_SCORES = {"score": ("RULER average (0-100)", "RULER average %{customdata[1]:.1f}"),
                 "accuracy": ("word problems solved (%)", "accuracy %{customdata[1]:.1f}%")}


def pareto_figure(rows: Sequence, metric: str = "delta_nll_pct", y_cap: float | None = None,
                  title: str = "Storage vs quality") -> go.Figure:
    """Storage vs `metric` per tier, with the Pareto front: a loss of PARETO_METRICS ("kld", "delta_nll_pct"), or a
    score of PARETO_SCORES ("score": RULER's average, higher is better, on a 0-100 axis). Storage counts every family
    alike (measure/quality.py stored_vs_bf16): per token seen, the tokens kept in the cache's format (bf16 when raw),
    over a bf16 cache; a press sits at the share it keeps.

    Error bars show `<metric>_se` (standard error over windows or samples) when the rows carry it. For a loss, points
    above `y_cap` (default: 1.3 x the largest value below the metric's "broken" level) sit on the top edge as
    triangles with their true value in the label, so a broken tier does not flatten the rest. Each family (codecs,
    the engines' formats, presses, presses over codecs, transformers' and llama.cpp's peers: family_of) is a trace of
    its own with its marker and colour, named in the legend. A row's `label`, if any, is drawn for its tier's name.
    """
    if metric not in PARETO_METRICS and metric not in PARETO_SCORES:
        raise ValueError(f"metric={metric!r} (allowed: {', '.join([*PARETO_METRICS, *PARETO_SCORES])})")
    score = metric in PARETO_SCORES
    axis_title, hover = PARETO_SCORES[metric] if score else PARETO_METRICS[metric][:2]
    rows = [r for r in _dicts(rows) if _finite(stored_vs_bf16(r)) is not None and _finite(r[metric]) is not None]
    xs = [stored_vs_bf16(r) for r in rows]
    ys = [r[metric] for r in rows]
    errors = [_finite(r.get(f"{metric.removesuffix('_pct')}_se")) for r in rows]
    if score:
        y_cap = math.inf
    elif y_cap is None:
        floor, broken = PARETO_METRICS[metric][2:]
        y_cap = max(floor, 1.3 * max([y + (e or 0.0) for y, e in zip(ys, errors) if y <= broken] or [floor]))
    front = pareto_front([(x, -y if score else y) for x, y in zip(xs, ys)])
    shown = [min(y, y_cap) for y in ys]
    held = " (%{customdata[0]:,} B)" if all(r.get("archive_bytes") for r in rows) else ""  # llama.cpp's: its own
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[xs[i] for i in front], y=[shown[i] for i in front], mode="lines", name="Pareto front",
        line=dict(color=NATIVE_COLOR, dash="dot", width=2), hoverinfo="skip",
    ))
    families = [family_of(r["tier"]) for r in rows]
    groups = [(family, [i for i, f in enumerate(families) if f == family]) for family in FAMILIES]
    groups = [(family, members) for family, members in groups if members]
    for name, members in groups:
        fig.add_trace(go.Scatter(
            x=[xs[i] for i in members], y=[shown[i] for i in members], mode="markers", name=name,
            text=[rows[i]["tier"] for i in members],
            error_y=dict(type="data", array=[errors[i] if errors[i] is not None and ys[i] <= y_cap else 0.0
                                             for i in members],
                         visible=any(errors[i] is not None for i in members), color="#6b7280", thickness=1.5,
                         width=6),
            marker=_pareto_marker(name, members, front, ys, y_cap),
            customdata=[[rows[i].get("archive_bytes"), ys[i]] for i in members],
            hovertemplate="%{text}<br>%{x:.3f}× bf16" + held + "<br>" + hover + "<extra></extra>",
        ))
    low = min(shown + [0.0])
    y_range = (-8.0, 108.0) if score else (low - 0.08 * (y_cap - low), y_cap * 1.08)
    x_low, x_high = min(xs + [1.0]), max(xs + [1.0])  # the bf16 line is always drawn
    x_range = (x_low - 0.06 * (x_high - x_low), x_high + 0.06 * (x_high - x_low))
    # llama.cpp's rows by their KV type alone ("q4_0"): the legend names the engine, and short labels find room
    labels = [(r.get("label") or r["tier"]).removeprefix("llamacpp-") + (f" ({y:.3g})" if y > y_cap else "")
              for r, y in zip(rows, ys)]
    for i, offset in enumerate(place_labels(xs, shown, labels, x_range, y_range)):
        if offset is None:
            continue
        ax, ay = offset
        fig.add_annotation(x=xs[i], y=shown[i], text=labels[i], ax=ax, ay=ay, showarrow=True, arrowhead=0,
                           arrowwidth=1, arrowcolor="#9ca3af", font=dict(size=14))
    if not score:
        fig.add_hline(y=0, line=dict(color=NATIVE_COLOR, width=1))
    fig.add_vline(x=1, line=dict(color=NATIVE_COLOR, width=1, dash="dash"), annotation_text="bf16 native")
    fig.update_yaxes(range=list(y_range), **({"tickvals": [0, 20, 40, 60, 80, 100]} if score else {}))
    fig.update_xaxes(range=list(x_range))
    # the legend's rows sit between the title (pinned 30 px from the top, below the app's plot label) and the plot;
    # the plot area is PLOT_AREA_PX high, the height the labels were placed for
    top = 70 + 30 * legend_rows(["Pareto front", *(name for name, _ in groups)])
    fig.update_layout(showlegend=len(groups) > 1, legend=dict(orientation="h", x=0, xanchor="left", y=1.02,
                                                             yanchor="bottom"),
                      height=PLOT_AREA_PX[1] + top + 70, margin=dict(t=top, b=70),
                      title=dict(y=1, yref="container", yanchor="top", pad=dict(t=30)))
    return themed(fig, title, "bytes stored per token seen / bf16 (×): kept tokens in the cache's format, "
                              "evicted ones free", axis_title)


CODEC_FAMILY, FORMAT_FAMILY, PRESS_FAMILY, PRESS_CODEC_FAMILY = (
    "codecs", "formats: FP8, FP4", "presses (token eviction)", "press + codec")
PEER_FAMILY, LLAMACPP_FAMILY = "peers: transformers QuantizedCache", "peers: llama.cpp KV types (vs its f16)"
VLLM_FAMILY = "vLLM's TurboQuant presets"
FAMILIES = (CODEC_FAMILY, FORMAT_FAMILY, VLLM_FAMILY, PRESS_FAMILY, PRESS_CODEC_FAMILY, PEER_FAMILY, LLAMACPP_FAMILY)
FAMILY_MARKERS = {  # family -> (symbol, colour, open): told apart by marker and colour
    FORMAT_FAMILY: ("star", FORMAT_COLOR, False), PRESS_FAMILY: ("triangle-down", PRESS_COLOR, False),
    PRESS_CODEC_FAMILY: ("hexagon", PRESS_COLOR, False), PEER_FAMILY: ("diamond-open", PEER_COLOR, True),
    LLAMACPP_FAMILY: ("square-open", LLAMACPP_COLOR, True), VLLM_FAMILY: ("pentagon", VLLM_COLOR, False),
}


def family_of(name: str) -> str:
    """Which family a row of the sweep is: a peer, a press (alone or over a codec), an engine format, a codec."""
    if name in PEERS:
        return PEER_FAMILY
    if name in LLAMACPP_PEERS:
        return LLAMACPP_FAMILY
    try:
        tier = get_tier(name)
    except ValueError:  # the Advanced panel's custom tier
        return CODEC_FAMILY
    if tier.press is not None:
        return PRESS_FAMILY if tier.key is None else PRESS_CODEC_FAMILY
    if isinstance(tier.value, TQValues):
        return VLLM_FAMILY
    formats = {"FP8", "FP4"}
    return FORMAT_FAMILY if {type(tier.key).__name__, type(tier.value).__name__} & formats else CODEC_FAMILY


def _pareto_marker(family: str, members: list[int], front: list[int], ys: list[float], y_cap: float) -> dict:
    """Codecs: filled circles, blue on the Pareto front; the other families their marker and colour (FAMILY_MARKERS);
    off the chart: triangles up."""
    if family in FAMILY_MARKERS:
        symbol, color, hollow = FAMILY_MARKERS[family]
        above = "triangle-up-open" if hollow else "triangle-up"
        return dict(size=15, color=color, line=dict(color=color, width=2.5 if hollow else 1),
                    symbol=[above if ys[i] > y_cap else symbol for i in members])
    return dict(size=14, symbol=["triangle-up" if ys[i] > y_cap else "circle" for i in members],
                color=[KEY_COLOR if i in front else NATIVE_COLOR for i in members])


def latency_figure(rows: Sequence) -> go.Figure:
    """Median decode ms/token per tier, with the native run's as a reference line."""
    rows = _dicts(rows)
    tiers = [r["tier"] for r in rows]
    native_ms = rows[0]["native_decode_ms"] if rows else math.nan
    fig = go.Figure(go.Bar(
        x=tiers, y=[_finite(r["decode_ms"]) for r in rows], name="tier", showlegend=False,
        marker_color=[NATIVE_COLOR if t == "native" else KEY_COLOR for t in tiers],
        text=[f"{r['latency_ratio']:.2f}×" if _finite(r["latency_ratio"]) else "" for r in rows],
        textposition="outside", hovertemplate="%{x}: %{y:.1f} ms/token (%{text} native)<extra></extra>",
    ))
    if _finite(native_ms) is not None:
        fig.add_trace(go.Scatter(x=tiers, y=[native_ms] * len(tiers), mode="lines", name=f"native {native_ms:.1f} ms",
                                 line=dict(color="#111827", dash="dash", width=2), hoverinfo="skip"))
    fig.update_layout(legend=dict(x=1, xanchor="right", y=1.0, yanchor="bottom", orientation="h"))
    tallest = max([_finite(r["decode_ms"]) or 0.0 for r in rows] + [_finite(native_ms) or 0.0])
    fig.update_yaxes(range=[0, 1.18 * tallest or 1])  # headroom for the ratio labels above the bars
    return themed(fig, "Decode latency (median after warm-up)", "tier", "decode time (ms / token)")


def token_match_figure(rows: Sequence) -> go.Figure:
    """Fraction of greedy positions where each tier emitted the native token."""
    rows = _dicts(rows)
    fig = go.Figure(go.Bar(
        x=[r["tier"] for r in rows], y=[100 * r["token_match"] for r in rows], marker_color=ACCENT_COLOR,
        text=[f"{100 * r['token_match']:.0f}%" for r in rows], textposition="outside",
        customdata=[r["first_divergence"] if r["first_divergence"] is not None else "none" for r in rows],
        hovertemplate="%{x}: %{y:.1f}% match, first divergence at %{customdata}<extra></extra>",
    ))
    fig.update_yaxes(range=[0, 110])
    return themed(fig, "Greedy token match with native", "tier", "tokens equal to native (%)")


def kv_heatmap_figure(head: HeadView, which: str = "key", tokens: Sequence[str] | None = None) -> go.Figure:
    """Original | reconstructed | |error| of one (layer, head), (tokens x head_dim); orig/recon share a scale."""
    if which not in ("key", "value"):
        raise ValueError(f"which={which!r} (allowed: 'key', 'value')")
    original, recon, error = (getattr(head, which + suffix) for suffix in ("", "_recon", "_error"))  # (S, D)
    limit = float(original.abs().max()) or 1.0
    y = list(range(original.shape[0]))
    hover_tokens = [[t] * original.shape[1] for t in tokens] if tokens is not None else None
    fig = make_subplots(rows=1, cols=3, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=("original", "reconstructed", "|error|"))
    for col, data, axis in ((1, original, "coloraxis"), (2, recon, "coloraxis"), (3, error, "coloraxis2")):
        fig.add_trace(go.Heatmap(
            z=data.tolist(), y=y, coloraxis=axis, customdata=hover_tokens,
            hovertemplate="token %{y}" + (" %{customdata}" if tokens is not None else "")
            + "<br>channel %{x}<br>%{z:.4f}<extra></extra>",
        ), row=1, col=col)
    fig.update_layout(
        coloraxis=dict(colorscale="RdBu_r", cmin=-limit, cmax=limit, colorbar=dict(x=1.0, len=0.9, title="value")),
        coloraxis2=dict(colorscale="Magma", cmin=0, colorbar=dict(x=1.09, len=0.9, title="|err|")),
        margin=dict(r=140),
    )
    start, end = head.archived
    if end > start:
        for col in (2, 3):
            for edge in (start - 0.5, end - 0.5):
                fig.add_hline(y=edge, line=dict(color=ACCENT_COLOR, width=1, dash="dot"), row=1, col=col)
    fig.update_yaxes(autorange="reversed", title_text="token position", row=1, col=1)
    fig.update_xaxes(title_text="channel (head_dim)")
    kind = "keys" if which == "key" else "values"
    archived = f"tokens {start}–{end - 1} archived" if end > start else "nothing archived"
    return themed(fig, f"Layer {head.layer}, head {head.head}: {kind} ({archived})")


def spectrum_figure(spectrum: Spectrum) -> go.Figure:
    """Share of energy per DCT frequency within blocks of r tokens, one line per layer, K and V; k cut marked."""
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=(f"keys: {float(spectrum.key_kept.mean()):.1%} kept at k={spectrum.k}",
                                        f"values: {float(spectrum.value_kept.mean()):.1%} kept"))
    layers = spectrum.key_energy.shape[0]
    freqs = list(range(spectrum.block_size))
    for col, energy in ((1, spectrum.key_energy), (2, spectrum.value_energy)):
        share = energy / energy.sum(-1, keepdim=True)  # (L, r)
        for layer in range(layers):
            fig.add_trace(go.Scatter(
                x=freqs, y=share[layer].tolist(), mode="lines", showlegend=False,
                line=dict(width=1.5, color=_gradient(layer, layers)), name=f"layer {layer}",
                hovertemplate=f"layer {layer}<br>frequency %{{x}}<br>%{{y:.2%}} of energy<extra></extra>",
            ), row=1, col=col)
        if spectrum.k < spectrum.block_size:
            fig.add_vline(x=spectrum.k - 0.5, line=dict(color="#dc2626", dash="dash", width=2), row=1, col=col)
    fig.update_yaxes(type="log", dtick=1, title_text="share of block energy (log)", row=1, col=1)
    fig.update_xaxes(title_text=f"frequency (r = {spectrum.block_size})", dtick=max(1, spectrum.block_size // 8))
    return themed(fig, "DCT spectrum along the sequence (dark = deep)")


def channel_spectrum_figure(channels: ChannelSpectrum) -> go.Figure:
    """Energy in the top-r principal components across heads and channels, one line per layer, K and V;
    with a PCA tier, a second row: the bits its calibration spends on each joint K+V component."""
    keys, values = (sum(c) / len(c) for c in channels.components_for(0.99))
    titles = [f"keys: {keys:.0f} of {channels.key_share.shape[1]} hold 99%",
              f"values: {values:.0f} of {channels.value_share.shape[1]}", "bits per joint K+V component (tier)"]
    if channels.bits:
        fig = make_subplots(rows=2, cols=2, specs=[[{}, {}], [{"colspan": 2}, None]], horizontal_spacing=0.08,
                            vertical_spacing=0.22, subplot_titles=titles)
        fig.update_layout(height=720)
    else:
        fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08, subplot_titles=titles[:2])
    layers = channels.key_share.shape[0]
    for col, share in ((1, channels.key_share), (2, channels.value_share)):
        for layer in range(layers):
            fig.add_trace(go.Scatter(
                x=list(range(1, share.shape[1] + 1)), y=share[layer].tolist(), mode="lines", showlegend=False,
                line=dict(width=1.5, color=_gradient(layer, layers)), name=f"layer {layer}",
                hovertemplate=f"layer {layer}<br>top %{{x}} components<br>%{{y:.2%}} of energy<extra></extra>",
            ), row=1, col=col)
        fig.update_xaxes(type="log", dtick=1, title_text="components kept (log)", row=1, col=col)
        fig.update_yaxes(range=[0, 1.05], row=1, col=col)
    for layer, bits in channels.bits.items():
        fig.add_trace(go.Scatter(
            x=list(range(1, bits.numel() + 1)), y=bits.tolist(), mode="lines", showlegend=False,
            line=dict(width=1.5, color=_gradient(layer, layers)), name=f"layer {layer}",
            hovertemplate=f"layer {layer}<br>component %{{x}}<br>%{{y:.2f}} bits/token<extra></extra>",
        ), row=2, col=1)
    if channels.bits:
        fig.update_xaxes(type="log", dtick=1, title_text="joint K+V component (log; dropped ones not shown)",
                         row=2, col=1)
        fig.update_yaxes(title_text="bits per token", row=2, col=1)
    fig.update_yaxes(title_text="share of energy", row=1, col=1)
    return themed(fig, "Channel spectrum per layer (dark = deep)")


def layer_error_figure(layers: Sequence[LayerError]) -> go.Figure:
    """Per-layer relative error (K, V, attention output) and PSNR (K, V); exact layers show no PSNR point."""
    index = [e.layer for e in layers]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    for name, attr, color in (("keys", "key", KEY_COLOR), ("values", "value", VALUE_COLOR)):
        fig.add_trace(go.Bar(x=index, y=[getattr(e, attr + "_rel_error") for e in layers], name=f"{name} rel. error",
                             marker_color=color), row=1, col=1)
        fig.add_trace(go.Scatter(x=index, y=[_finite(getattr(e, attr + "_psnr_db")) for e in layers],
                                 mode="lines+markers", name=f"{name} PSNR", line=dict(color=color)), row=2, col=1)
    fig.add_trace(go.Scatter(x=index, y=[e.attention_rel_error for e in layers], mode="lines+markers",
                             name="attention output rel. error", line=dict(color=ACCENT_COLOR)), row=1, col=1)
    fig.update_layout(barmode="group", height=560, margin=dict(b=150),
                      legend=dict(orientation="h", x=0, y=-0.3, yanchor="top"))
    fig.update_yaxes(title_text="‖x̂ − x‖ / ‖x‖", row=1, col=1)
    fig.update_yaxes(title_text="PSNR (dB)", row=2, col=1)
    fig.update_xaxes(title_text="layer", row=2, col=1)
    return themed(fig, "Reconstruction error per layer")


def token_kld_figure(kld: Sequence[float], tokens: Sequence[str], tier: str) -> go.Figure:
    """Per-token KL divergence from the native next-token distribution along the scored text."""
    values = list(kld)
    fig = go.Figure(go.Scatter(
        x=list(range(len(values))), y=values, mode="lines+markers", line=dict(color=VALUE_COLOR, width=2),
        marker=dict(size=5), customdata=list(tokens)[: len(values)],
        hovertemplate="position %{x} %{customdata}<br>KL %{y:.4f} nats<extra></extra>",
    ))
    fig.add_hline(y=0, line=dict(color=NATIVE_COLOR, width=1))
    mean = sum(values) / len(values) if values else math.nan
    return themed(fig, f"{tier}: per-token KL divergence from native (mean {mean:.4f} nats)",
                  "scored token position", "KL(native ‖ tier) (nats)")


def var_ratio_figure(layers: Sequence[LayerError]) -> go.Figure:
    """Var(Δ)/Var(X) along the sequence per layer: low means smooth (what DCT exploits), 2 is white noise."""
    index = [e.layer for e in layers]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=index, y=[e.key_var_ratio for e in layers], mode="lines+markers", name="keys",
                             line=dict(color=KEY_COLOR)))
    fig.add_trace(go.Scatter(x=index, y=[e.value_var_ratio for e in layers], mode="lines+markers", name="values",
                             line=dict(color=VALUE_COLOR)))
    fig.add_hline(y=2, line=dict(color=NATIVE_COLOR, dash="dash"), annotation_text="white noise (2)")
    return themed(fig, "Smoothness along the sequence: Var(Δx) / Var(x)", "layer", "Var(Δx) / Var(x)")


def _gradient(i: int, n: int) -> str:
    """Light blue (first layer) to dark navy (last layer)."""
    t = i / max(n - 1, 1)
    light, dark = (147, 197, 253), (30, 27, 75)
    r, g, b = (round(a + (c - a) * t) for a, c in zip(light, dark))
    return f"rgb({r},{g},{b})"


def needle_figure(grid) -> go.Figure:
    """Pass-key retrieval per tier: one depth x length panel each, green = retrieved (measure/needle.py)."""
    tiers = grid.tiers
    fig = make_subplots(rows=1, cols=len(tiers), shared_yaxes=True, horizontal_spacing=0.02,
                        subplot_titles=[f"{t} ({int(grid.retrieved(t).sum())}/{grid.retrieved(t).numel()})"
                                        for t in tiers])
    x = [f"{n / 1024:.0f}k" if n >= 1024 else str(n) for n in grid.lengths]  # short: panels are narrow
    y = [f"{d:.0%}" for d in grid.depths]
    for col, tier in enumerate(tiers, start=1):
        fig.add_trace(go.Heatmap(
            z=grid.retrieved(tier).tolist(), x=x, y=y, zmin=0, zmax=1, showscale=False, xgap=2, ygap=2,
            colorscale=[[0, "#fca5a5"], [0.5, "#fca5a5"], [0.5, "#86efac"], [1, "#86efac"]],
            hovertemplate=f"{tier}<br>%{{x}} tokens, key at %{{y}}<br>retrieved: %{{z}}<extra></extra>",
        ), row=1, col=col)
    fig.update_xaxes(title_text="prompt tokens", type="category")
    fig.update_yaxes(title_text="depth of the key", type="category", row=1, col=1)
    return themed(fig, "Pass-key retrieval (green: the key is in the greedy answer)")


def memory_figure(rows: Sequence, field: str = "held_bytes", title: str = "Held by the cache vs context") -> go.Figure:
    """Bytes (MiB, log scale) against prompt tokens: one line per tier and mode (measure/memory.py rows)."""
    fig = go.Figure()
    series: dict[str, list[dict]] = {}
    for row in _dicts(rows):
        if row.get(field, -1) >= 0:
            name = row["tier"] if row["mode"] == "native" else f"{row['tier']} ({row['mode']})"
            series.setdefault(name, []).append(row)
    for index, (name, points) in enumerate(series.items()):
        points.sort(key=lambda r: r["context"])
        native = name == "native"
        fig.add_trace(go.Scatter(
            x=[r["context"] for r in points], y=[r[field] / 2**20 for r in points], name=name, mode="lines+markers",
            line=dict(color=NATIVE_COLOR if native else CODEC_COLORS[index % len(CODEC_COLORS)],
                      dash="dot" if name.endswith("(view)") else "solid", width=3 if native else 2),
        ))
    fig.update_yaxes(type="log", dtick=1)
    fig.update_xaxes(type="log", tickvals=sorted({r["context"] for p in series.values() for r in p}))
    return themed(fig, title, "prompt tokens", "MiB")


def layer_tier_figure(layers: Sequence[LayerError]) -> go.Figure:
    """The tier of every layer (a schedule's allocation) and the bytes it stores vs bf16, one color per tier."""
    fig = go.Figure()
    names = list(dict.fromkeys(e.tier for e in layers if e.codec))
    for position, name in enumerate(names):
        chosen = [e for e in layers if e.codec and e.tier == name]
        fig.add_trace(go.Bar(
            x=[e.layer for e in chosen], y=[e.ratio_vs_bf16 for e in chosen], name=name,
            marker_color=CODEC_COLORS[position % len(CODEC_COLORS)], customdata=[name] * len(chosen),
            hovertemplate="layer %{x}: %{customdata}<br>%{y:.3f} of bf16<extra></extra>",
        ))
    native = [e.layer for e in layers if not e.codec]
    if native:
        fig.add_trace(go.Scatter(x=native, y=[0] * len(native), mode="markers", name="native (not coded)",
                                 marker=dict(color=NATIVE_COLOR, symbol="line-ew-open", size=14)))
    fig.update_layout(bargap=0.15)  # the legend (one entry per tier) stays on the right, clear of the axis titles
    return themed(fig, "Tier per layer: bytes stored vs bf16", "layer", "stored / bf16")
