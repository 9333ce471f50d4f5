"""Per-tier quality on long text: bytes vs bf16, KL divergence, top-1 agreement and ΔNLL, with their spread.

    run = measure_quality(loaded, ["png", "turbo-4"], windows=4, length=512)              # embedded corpus
    run = measure_quality(loaded, ["turbo-4"], source="docstrings")                        # the held-out text
    run = measure_quality(loaded, ["turbo-4"], text=user_text, windows=2, length=512)      # any text
    run.rows        # QualityRow per tier (native first): the table of `python -m codeckv quality` and the Sweep tab
    run.scores      # tier -> per-position NLL / KLD / top-1 (W, positions), for per-token charts
    run = measure_quality(loaded, ["turbo-4", "hf-quanto-int4"])                          # a peer beside a tier
    run.absent      # one line per peer that cannot run here (codeckv/measure/peers.py), instead of its row
    run = measure_quality(loaded, ["snapkv-50"], windows=4, length=1280, prefix=1024)     # a press: 1,024 pressed
    run = measure_quality(loaded, ["turbo-4"], windows=8, window=3)                       # the 4th of 8 windows only

A press evicts from the prefix (the context) under the cache's press protocol (`press_mode`, codeckv/presses/base.py):
"once", kvpress's (the prefix prefilled in one forward and pressed after it; what follows is not), or "chunked" (the
prefix fed in PREFILL_CHUNK-token chunks, each pressed as it arrives). Every row says which (`press_mode`, empty for a
tier without a press) and how long its prefix was; a press needs a prefix well past its observation window (64
queries) to keep more than that window, so press rows are measured on 1,024-token prefixes (docs/quality.md).

What a row stores (`stored_vs_bf16`, the x axis of the Pareto charts) counts every family alike, per token seen and
in the storage dtype of the bf16 reference: the share of the tokens the cache still holds (a press evicts the rest)
times the bytes per token of the cache's format, bf16 for raw tokens (native, a press alone) and the codec's steady
state for coded ones. `ratio_vs_bf16` and `held_bytes` stay what this run held (fp32 raw tokens included).

Native and every tier are fed the same windows together (measure/lockstep.py: one forward per position
for all of them, in as few stacked batches as memory allows), and every tier is compared with native. A window
of `length` tokens is followed by one more token, the target of the last prediction, so every cache
holds exactly `length` tokens when its bytes are read. A peer (transformers' QuantizedCache, codeckv/measure/peers.py)
rides in the same batch as the tiers, its bytes counted from the tensors it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from codeckv.cache import footprint, held_bytes, make_cache
from codeckv.cache.layers import CodecLayer
from codeckv.corpus import source_text, text_windows
from codeckv.loaded import LoadedModel
from codeckv.measure.llamacpp import ATTENTION as LLAMACPP_ATTENTION
from codeckv.measure.llamacpp import LLAMACPP_REFERENCE, LlamaCppPeer, get_llamacpp_peer
from codeckv.measure.llamacpp_runs import LlamaCppQuality, score_llamacpp
from codeckv.measure.lockstep import Reference, Scores, compare, lockstep, stack_size
from codeckv.measure.peers import ATTENTION as PEER_ATTENTION
from codeckv.measure.peers import Peer, absent_reason, make_peer_cache, packing_reason, peer_footprint
from codeckv.measure.runs import attention_counts
from codeckv.measure.side_by_side import PREFILL_CHUNK
from codeckv.measure.table import counts_of
from codeckv.measure.yardstick import Yardstick, yardstick
from codeckv.presses import check_press_mode
from codeckv.tiers import TIERS, Tier

Progress = Callable[[int, int, str], None]  # (forwards done, forwards in all, message); may raise to stop
# Lockstep scoring keeps decoded views: every tier decodes one token per step for hundreds of steps beside the
# others, and on a CPU the torch path's attention on the codes (1.2-1.6x SDPA per step) makes a many-tier sweep
# several times slower; the attention it computes is the same up to float rounding (tests/cache/test_attention.py).
# The committed quality CSVs were measured so too. `held_bytes` of a row then says what the view costs.
SCORING_ON_CODES = False
LLAMACPP_REFERENCE_LABEL = "llama.cpp f16"  # the reference of the llama.cpp rows (QualityRow.reference)


@dataclass
class QualityRow:
    tier: str
    description: str
    archive_bytes: int  # codec-carrying layers holding `length` tokens (per window)
    bf16_bytes: int  # a bf16 native cache of the same tokens
    held_bytes: int  # every tensor the cache owned at run time, per window (views, raw tokens, slack included)
    attention: dict[str, int]  # codec layers per attention mode (measure/runs.py MODES; a peer: its one mode)
    ratio_vs_bf16: float  # archive / bf16 at this window length (raw tail and sinks included)
    steady_state_ratio: float  # bytes per archived token / bf16 bytes per token (nan if nothing archived)
    kept_share: float  # tokens held / tokens seen at the window's end (a press evicted the rest; else 1)
    stored_vs_bf16: float  # kept_share x bytes per token of the format (bf16 when raw) / bf16 (module docstring)
    kld: float  # mean KL(native || tier), nats per token
    kld_se: float  # standard error over windows
    top1_pct: float  # % positions where the tier's argmax is native's
    top1_se: float
    nll: float
    delta_nll_pct: float
    delta_nll_se: float
    entropy_coded_bytes: int | None  # lossless tiers: the archive after byte shuffling + zstd (None otherwise)
    source: str  # "corpus", "docstrings" or "text"
    windows: int
    tokens_per_window: int
    scored_positions: int  # per window
    yardstick: Yardstick  # llama.cpp's tails: KLD and Δp percentiles, RMS Δp (measure/yardstick.py)
    reference: str = "native"  # what KLD, top-1 and ΔNLL are against: native, or llama.cpp's own f16 cache
    prefix_tokens: int = 0  # tokens prefilled per window before the scored ones (the context a press evicts from)
    press_mode: str = ""  # a press's protocol, "once" or "chunked"; "" for a tier without a press


@dataclass
class QualityRun:
    """Rows of the table, and what is behind them."""

    rows: list[QualityRow]
    reference: Reference
    scores: dict[str, Scores]  # tier name -> per-position metrics
    scored_tokens: list[str]  # window 0's scored tokens as text (chart hover)
    absent: list[str] = field(default_factory=list)  # one line per peer asked for that cannot run here
    llamacpp: LlamaCppQuality | None = None  # llama.cpp's types' own run (its f16 reference and their scores)


def measure_quality(
    loaded: LoadedModel,
    tiers: list[Tier | Peer | LlamaCppPeer],
    windows: int = 4,
    length: int = 512,
    source: str = "corpus",
    text: str | None = None,
    progress: Progress | None = None,
    prefix: int | None = None,
    press_mode: str = "once",
    window: int | None = None,
) -> QualityRun:
    """Native and each tier or peer in lockstep, on `windows` windows of `length` tokens of `text` or the named source.

    prefix: tokens prefilled before the scored ones (default half the window); press_mode: a press's protocol;
    window: measure only this one of the `windows` consecutive windows (a grid cell: measure/window_job.py).

    A peer that cannot run here (its package missing, a hybrid model) gets no row but a line in `absent`.
    llama.cpp's KV types (measure/llamacpp.py) run in llama.cpp on the same token ids and protocol after the others,
    against llama.cpp's own f16 cache, whose row comes with theirs (`reference` says so).
    """
    if not tiers:
        raise ValueError("choose at least one tier")
    check_press_mode(press_mode)
    prefix = (length + 1) // 2 if prefix is None else prefix  # a peer quantizes these at once, then its window
    if not 1 <= prefix <= length - 1:
        raise ValueError(f"prefix={prefix} must leave scored tokens in a window of {length} (allowed: 1..{length - 1})")
    if window is not None and not 0 <= window < windows:
        raise ValueError(f"window {window} of {windows} (allowed: 0..{windows - 1})")
    fed = windows if window is None else 1  # the windows fed together
    heads, dim = loaded.info.num_kv_heads, loaded.info.head_dim
    reasons = {t.name: absent_reason(t, loaded.info) or (packing_reason(t, fed, heads, prefix, dim)
                                                         if isinstance(t, Peer) else None)
               for t in tiers if isinstance(t, Peer | LlamaCppPeer)}
    tiers = [t for t in tiers if not reasons.get(t.name)]
    llama = [t for t in tiers if isinstance(t, LlamaCppPeer)]
    tiers = [t for t in tiers if not isinstance(t, LlamaCppPeer)]
    label = "text" if text is not None else source
    data = text_windows(loaded.tokenizer, text if text is not None else source_text(source), windows,
                        length + 1, "the text" if text is not None else f"the {source}")
    data = data if window is None else data[window : window + 1]
    runs = [TIERS["native"], *(t for t in tiers if not t.is_native)]  # native first: the reference
    size = stack_size(loaded.info, fed, length + 1)
    groups = [runs[i : i + size] for i in range(0, len(runs), size)]
    llama_runs = len({LLAMACPP_REFERENCE.name, *(t.name for t in llama)}) if llama else 0
    total = (len(groups) + llama_runs * fed) * (length - prefix)  # a forward per scored position and batch
    done = 0

    def step(message: str) -> Callable[[], None]:
        def on_step() -> None:
            nonlocal done
            done += 1
            if progress:
                progress(done, total, message)

        return on_step

    reference, scores, caches = None, {}, {}
    for group in groups:
        built = [make_peer_cache(loaded, tier) if isinstance(tier, Peer)
                 else make_cache(loaded, tier, materialization_free=SCORING_ON_CODES, press_mode=press_mode)
                 for tier in group]
        names = f"{len(group)} caches in one batch, {group[0].name} to {group[-1].name}" if group[1:] else group[0].name
        chunk = PREFILL_CHUNK if press_mode == "chunked" and any(getattr(t, "evicts", False) for t in group) else None
        reference, got = lockstep(loaded.model, data, built, prefix, reference, step(names), chunk)
        for tier, cache, tier_scores in zip(group, built, got):
            scores[tier.name], caches[tier.name] = tier_scores, cache
    rows = [quality_row(tier, reference, scores[tier.name], caches[tier.name], label, length, press_mode)
            for tier in runs]
    run = None
    if llama:
        base = done
        report = (lambda n, _, name: progress(base + n, total, f"llama.cpp {name}")) if progress else None
        run = score_llamacpp(data, llama, prefix, loaded.info.name, progress=report)
        layers = len(loaded.info.layer_types)
        rows += [_llamacpp_row(get_llamacpp_peer(name), run, layers, label, fed, length) for name in run.scores]
    tokens = [loaded.tokenizer.decode([t]) for t in reference.targets[0].tolist()]
    return QualityRun(rows, reference, scores, tokens, [reason for reason in reasons.values() if reason], run)


def stored_vs_bf16(row: dict) -> float:
    """What a quality row (a CSV's dict) stores per token seen vs bf16 (module docstring): its `stored_vs_bf16`, or
    for a row written before that column, its steady state (a codec's bytes per token), 1.0 for native."""
    value = row.get("stored_vs_bf16")
    if value not in (None, "") and float(value) == float(value):
        return float(value)
    if row["tier"] == "native":
        return 1.0
    steady = float(row.get("steady_state_ratio") or "nan")
    return steady if steady == steady else float(row["ratio_vs_bf16"])


def quality_row(tier: Tier | Peer, reference: Reference, scores: Scores, cache, source: str, length: int,
                press_mode: str, rows: int | None = None) -> QualityRow:
    """A tier's row from its scores on the reference's windows; `cache` holds `rows` of them (default: every window,
    as lockstep feeds them), so its bytes are per window."""
    windows = reference.windows.shape[0]
    rows = rows or windows
    peer = isinstance(tier, Peer)
    fp = peer_footprint(cache) if peer else footprint(cache)
    stats = compare(reference, scores)
    entropy = None if peer else entropy_coded_bytes(cache)
    return QualityRow(
        tier=tier.name,
        description=tier.description,
        archive_bytes=fp.archive_bytes // rows,
        bf16_bytes=fp.bf16_bytes // rows,
        held_bytes=(fp.resident_bytes if peer else held_bytes(cache)) // rows,
        attention={PEER_ATTENTION: len(cache.layers)} if peer else attention_counts(cache),
        ratio_vs_bf16=fp.ratio,
        steady_state_ratio=fp.steady_state_ratio if not tier.is_native else fp.ratio,
        kept_share=fp.kept_share if not peer else 1.0,
        stored_vs_bf16=fp.ratio if peer else fp.stored_ratio(tier.coded),
        kld=stats.kld.mean,
        kld_se=stats.kld.se,
        top1_pct=stats.top1_pct.mean,
        top1_se=stats.top1_pct.se,
        nll=stats.nll,
        delta_nll_pct=stats.delta_nll_pct.mean,
        delta_nll_se=stats.delta_nll_pct.se,
        entropy_coded_bytes=entropy // rows if entropy else None,
        source=source,
        windows=windows,
        tokens_per_window=length,
        scored_positions=reference.positions,
        yardstick=yardstick(reference, scores),
        prefix_tokens=reference.prefix,
        press_mode=press_mode if getattr(tier, "evicts", False) else "",
    )


def combined_row(window_rows: list[dict], references: dict[str, Reference], scores: Scores) -> QualityRow:
    """A tier's row over windows measured one at a time (measure/window_job.py): `window_rows` its one-window rows
    as read back from a CSV, `scores` their per-position scores stacked (W, positions), `references` by the rows'
    `reference` label. Bytes and ratios are the windows' mean; KLD, top-1, ΔNLL and the yardstick are computed from
    the scores as quality_row computes them."""
    first, windows = window_rows[0], len(window_rows)
    reference = references[first["reference"]]
    stats = compare(reference, scores)

    def mean(column: str, kind=float):
        values = [row[column] for row in window_rows]
        return None if any(v in ("", None) for v in values) else kind(sum(kind(v) for v in values) / windows)

    return QualityRow(
        tier=first["tier"], description=first["description"], archive_bytes=mean("archive_bytes", int),
        bf16_bytes=mean("bf16_bytes", int), held_bytes=mean("held_bytes", int), attention=counts_of(first["attention"]),
        ratio_vs_bf16=mean("ratio_vs_bf16"), steady_state_ratio=mean("steady_state_ratio"),
        kept_share=mean("kept_share"), stored_vs_bf16=mean("stored_vs_bf16"), kld=stats.kld.mean,
        kld_se=stats.kld.se, top1_pct=stats.top1_pct.mean, top1_se=stats.top1_pct.se, nll=stats.nll,
        delta_nll_pct=stats.delta_nll_pct.mean, delta_nll_se=stats.delta_nll_pct.se,
        entropy_coded_bytes=mean("entropy_coded_bytes", int), source=first["source"], windows=windows,
        tokens_per_window=int(first["tokens_per_window"]), scored_positions=reference.positions,
        yardstick=yardstick(reference, scores), reference=first["reference"], prefix_tokens=reference.prefix,
        press_mode=first["press_mode"],
    )


def _llamacpp_row(peer: LlamaCppPeer, run: LlamaCppQuality, layers: int, source: str, windows: int,
                  length: int) -> QualityRow:
    """A llama.cpp configuration against llama.cpp's f16 cache on the same windows: bytes by ggml's blocks, held
    as the KV buffer llama.cpp allocated for its context (llamacpp_runs.LlamaCppBytes)."""
    scores, held = run.scores[peer.name], run.bytes[peer.name]
    stats = compare(run.reference, scores)
    return QualityRow(
        tier=peer.name, description=peer.description, archive_bytes=held.rule_bytes, bf16_bytes=held.f16_rule_bytes,
        held_bytes=held.kv_buffer_bytes, attention={LLAMACPP_ATTENTION: layers},
        ratio_vs_bf16=held.ratio_vs_f16, steady_state_ratio=held.ratio_vs_f16, kept_share=1.0,
        stored_vs_bf16=held.ratio_vs_f16, kld=stats.kld.mean, kld_se=stats.kld.se, top1_pct=stats.top1_pct.mean,
        top1_se=stats.top1_pct.se,
        nll=stats.nll, delta_nll_pct=stats.delta_nll_pct.mean, delta_nll_se=stats.delta_nll_pct.se,
        entropy_coded_bytes=None, source=source, windows=windows, tokens_per_window=length,
        scored_positions=run.reference.positions, yardstick=yardstick(run.reference, scores),
        reference=LLAMACPP_REFERENCE_LABEL, prefix_tokens=run.reference.prefix,
    )


def entropy_coded_bytes(cache) -> int | None:
    """Bytes of a lossless cache's archive after entropy coding, raw tokens included; None for other caches.

    Only codecs that know their entropy-coded size (Delta: byte shuffle + zstd) report one.
    """
    total = 0
    for layer in getattr(cache, "layers", []):
        if not isinstance(layer, CodecLayer):
            continue
        codecs = (layer.tier.key, layer.tier.value)
        if not all(hasattr(c, "entropy_nbytes") for c in codecs):
            return None
        fp = layer.footprint(0)
        total += fp.archive_bytes - fp.code_bytes  # raw sinks / tail, kept as they are
        for codec, archive in zip(codecs, (layer.archive_k, layer.archive_v)):
            if archive.tokens:
                total += codec.entropy_nbytes(archive.encoded())
    return total or None


def as_dicts(rows: list[QualityRow]) -> list[dict]:
    """Rows as flat dicts (CSV columns): the yardstick's tails as kld_p99, dp_rms, ... columns."""
    return [{**{k: v for k, v in asdict(r).items() if k != "yardstick"}, **r.yardstick.columns()} for r in rows]
