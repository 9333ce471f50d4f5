"""What each app request does, from the raw values a browser or an API caller sends to measured results.

    outcome = sweep_request(loaded, LONG_TEXT, source=..., windows=2, length=512, tiers=[...], progress=cb)
    grid = needle_request(loaded, ["512", "1024"], ["0%", "100%"], ["turbo-4"], progress=cb)
    for native, codec, native_stats, codec_stats in chat_stream(loaded, session, user, shown, tier, 96, False, limits):
        ...
    figures, summary = inspect_request(loaded, text, tier, layer=3, head=1, which="K", limits=limits)
    rows = memory_request(loaded, ["1024", "4096"], ["turbo-4", "pca-8x"], 16, progress=cb)
    path = chat_download(loaded, session, folder); native, codec, notes = chat_resume(loaded, session, upload, limits)

Every value is checked here or in codeckv/serve/inputs.py before it reaches a loader, a loop or an
allocation, and every request runs under the budgets of codeckv/serve/limits.py; what a tab shows of a
finished result is codeckv/serve/tab_views.py's; app.py only maps these results onto its components.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import plotly.graph_objects as go

from codeckv.cache.pca_layer import tokens_before_coder
from codeckv.cache.saved_format import tier_from_spec
from codeckv.cache.saved_load import read_header
from codeckv.figures import inspect_figures, quality_figures, sweep_figures, token_kld_figure
from codeckv.loaded import LoadedModel
from codeckv.measure.chat import ChatSession
from codeckv.measure.inspection import inspect_tier
from codeckv.measure.memory import beside_native, memory_rows, modes_of
from codeckv.measure.needle import NeedleGrid, needle_grid
from codeckv.measure.peers import Peer
from codeckv.measure.quality import QualityRun, measure_quality
from codeckv.measure.quality import as_dicts as quality_dicts
from codeckv.measure.side_by_side import prompt_ids
from codeckv.measure.sweep import Sweep, sweep
from codeckv.measure.sweep import as_dicts as sweep_dicts
from codeckv.models import ModelUnavailableError, model_config
from codeckv.presses import PRESS_MODES
from codeckv.serve.formatting import (
    codec_stats_markdown,
    inspect_summary,
    native_stats_markdown,
    progress_markdown,
    quality_table,
    session_markdown,
    stopped_markdown,
    sweep_table,
)
from codeckv.serve.inputs import chosen_tiers, fits_model, one_of, read_text_file, saved_cache_file, user_text, whole
from codeckv.serve.limits import Deadline, Limits, StopFlag
from codeckv.serve.preparation import PREPARATION
from codeckv.serve.sessions import IDLE
from codeckv.serve.zerogpu import MAX_SECONDS, estimate_seconds
from codeckv.tiers import TIERS, Tier

LONG_TEXT = "long text: KL divergence, top-1, ΔNLL with their spread over windows"
ONE_PROMPT = "one chat prompt: latency, token match, first divergence (a single sample)"
SOURCES = {"embedded corpus (Python reference)": "corpus", "held-out text (stdlib docstrings)": "docstrings",
           "other domain (King James Bible)": "bible", "pasted text": "pasted", "uploaded file": "file"}
LONG_CONTEXT_AXIS = "long-context score (the Long context tab's last grid)"
METRICS = {"KL divergence": "kld", "ΔNLL": "delta_nll_pct", LONG_CONTEXT_AXIS: "score"}  # the sweep's quality axis
NEEDLE_LENGTHS = (512, 1024, 2048, 4096, 8000)
NEEDLE_DEPTHS = ("0%", "25%", "50%", "75%", "100%")
MEMORY_CONTEXTS = (512, 1024, 2048, 4096, 8192)
Progress = Callable[[int, int, str], None]


@dataclass
class SweepOutcome:
    result: QualityRun | Sweep
    table: dict  # {"headers": [...], "data": [[...]]}
    figures: dict[str, go.Figure]
    rows: list[dict]  # for CSV / JSON
    about: dict  # what was measured, for the JSON report


def bar_progress(progress) -> Progress:
    """A Progress callback driving a Gradio progress bar (gr.Progress): fraction done and the message."""
    return lambda done, total, message: progress((done, total), desc=message)


def until(deadline: Deadline, progress: Progress | None, stop: StopFlag | None = None) -> Progress:
    """A progress callback that also stops the work once the deadline has passed or a stop was requested."""

    def report(done: int, total: int, message: str) -> None:
        deadline.check()
        if stop is not None:
            stop.check()
        if progress:
            progress(done, total, message)

    return report


def sweep_request(loaded: LoadedModel, mode, source, pasted, upload, windows, length, prompt, new_tokens, tiers,
                  progress: Progress | None = None, limits: Limits | None = None,
                  stop: StopFlag | None = None) -> SweepOutcome:
    """Every chosen tier on long text (quality with its spread) or on one chat prompt (one reply)."""
    limits = limits or Limits.from_env()
    mode, tiers = one_of(mode, "mode", (LONG_TEXT, ONE_PROMPT)), chosen_tiers(tiers, peers=True)
    report = until(limits.deadline(), progress, stop)
    peers = [t.name for t in tiers if isinstance(t, Peer)]
    if mode == ONE_PROMPT and peers:
        raise ValueError(f"the peers ({', '.join(peers)}) are measured on long text only: "
                         f"choose {LONG_TEXT!r} or leave them out")
    if mode == ONE_PROMPT:
        prompt = user_text(prompt)
        new_tokens = whole(new_tokens, "new tokens per tier", 1, min(128, limits.max_new_tokens))
        prepared(loaded, tiers, report)
        result = sweep(loaded, [{"role": "user", "content": prompt}], tiers, new_tokens, progress=report)
        about = {"mode": "one prompt", "prompt": prompt, "new_tokens": new_tokens}
        return SweepOutcome(result, sweep_table(result.rows), sweep_figures(result), sweep_dicts(result.rows), about)
    kind = SOURCES[one_of(source, "text", SOURCES)]
    windows, length = whole(windows, "windows", 1, 8), whole(length, "tokens per window", 64, 2048)
    if windows * length > limits.max_sweep_tokens:
        raise ValueError(f"{windows} windows x {length} tokens = {windows * length:,} tokens, more than the "
                         f"{limits.max_sweep_tokens:,} allowed per sweep here")
    text = None
    if kind == "pasted":
        text = user_text(pasted, "the pasted text", limits.max_text_chars)
    elif kind == "file":
        if not upload:
            raise ValueError("upload a .txt or .md file first")
        text = read_text_file(upload, limits.max_text_chars)
    prepared(loaded, tiers, report)
    result = measure_quality(loaded, tiers, windows, length, "corpus" if text else kind, text, report)
    about = {"mode": "long text", "source": kind, "windows": windows, "tokens_per_window": length,
             "absent": result.absent}
    table = quality_table(result.rows, result.absent)
    return SweepOutcome(result, table, quality_figures(result), quality_dicts(result.rows), about)


def chat_gpu_seconds(message, document, upload, model_name, tier_name, max_new_tokens, *rest) -> int:
    """The ZeroGPU slot a chat turn asks for (codeckv.serve.zerogpu): prompt chunks at the prompt limit plus three
    forwards per new token (native, codec, the teacher-forced native reply); garbage asks for the most."""
    limits = Limits.from_env()
    try:
        new_tokens = whole(max_new_tokens, "max new tokens", 1, limits.max_new_tokens)
    except ValueError:
        new_tokens = limits.max_new_tokens  # the handler refuses it; the slot just must not be too short
    return estimate_seconds(forwards=limits.max_prompt_tokens // 512 + 3 * new_tokens)


INSPECT_GPU_SECONDS = estimate_seconds(forwards=2 * Limits().max_inspect_tokens // 512)  # two prefills
LONG_GPU_SECONDS = MAX_SECONDS  # a sweep or a needle grid asks for the longest slot a visitor may hold


def needle_cells(lengths, depths, limits: Limits | None = None,
                 press_mode: str = "once") -> tuple[list[int], list[float]]:
    """The chosen lengths (tokens) and depths (fractions), checked against the choices and the budget, and the press
    protocol against PRESS_MODES."""
    limits = limits or Limits.from_env()
    one_of(press_mode, "press protocol", PRESS_MODES)
    if not isinstance(lengths, list | tuple) or not lengths or not isinstance(depths, list | tuple) or not depths:
        raise ValueError("choose at least one length and one depth")
    lengths = sorted({int(one_of(str(n), "prompt tokens", map(str, NEEDLE_LENGTHS))) for n in lengths})
    depths = sorted({float(one_of(d, "depth", NEEDLE_DEPTHS).rstrip("%")) / 100 for d in depths})
    if sum(lengths) * len(depths) > limits.max_needle_tokens:
        raise ValueError(f"{len(lengths) * len(depths)} cells of {sum(lengths) * len(depths):,} prompt tokens in "
                         f"all, more than the {limits.max_needle_tokens:,} allowed per request here: choose fewer")
    return lengths, depths


def needle_request(loaded: LoadedModel, lengths, depths, tiers, progress: Progress | None = None,
                   limits: Limits | None = None, stop: StopFlag | None = None, press_mode: str = "once") -> NeedleGrid:
    """Pass-key retrieval of native and every chosen tier over the chosen lengths and depths; presses under
    `press_mode` (codeckv/presses/base.py PRESS_MODES)."""
    limits = limits or Limits.from_env()
    lengths, depths = needle_cells(lengths, depths, limits, press_mode)
    tiers = chosen_tiers(tiers, allow_native=False, peers=True) if tiers else []
    report = until(limits.deadline(), progress, stop)
    prepared(loaded, tiers, report)
    return needle_grid(loaded, tiers, lengths, depths, report, press_mode)


def memory_request(loaded: LoadedModel, contexts, tiers, new_tokens, progress: Progress | None = None,
                   limits: Limits | None = None, stop: StopFlag | None = None) -> list[dict]:
    """Held, peak and at-rest bytes of native and every chosen tier over the chosen contexts: one row each."""
    limits = limits or Limits.from_env()
    if not isinstance(contexts, list | tuple) or not contexts:
        raise ValueError("choose at least one context length")
    contexts = sorted({int(one_of(str(n), "prompt tokens", map(str, MEMORY_CONTEXTS))) for n in contexts})
    tiers = chosen_tiers(tiers, allow_native=False) if tiers else []
    new_tokens = whole(new_tokens, "new tokens", 1, min(64, limits.max_new_tokens))
    turns = sum(len(modes_of(t)) for t in [TIERS["native"], *tiers])
    if sum(contexts) * turns > limits.max_memory_tokens:
        raise ValueError(f"{turns} caches x {sum(contexts):,} prompt tokens = {sum(contexts) * turns:,} tokens, more "
                         f"than the {limits.max_memory_tokens:,} allowed per request here: choose fewer")
    report = until(limits.deadline(), progress, stop)
    prepared(loaded, tiers, report)
    return beside_native(memory_rows(loaded, tiers, contexts, new_tokens, report))


def chat_panels(session: ChatSession, pending: tuple[str, str, str] | None = None) -> tuple[list, list]:
    """The two chat panels: every exchange so far (the native and the codec side), then the turn in progress."""
    native, codec = [], []
    turns = [(e.shown, e.native, e.codec) for e in session.exchanges] + ([pending] if pending else [])
    for shown, native_reply, codec_reply in turns:
        native += [{"role": "user", "content": shown}, {"role": "assistant", "content": native_reply}]
        codec += [{"role": "user", "content": shown}, {"role": "assistant", "content": codec_reply}]
    return native, codec


def chat_stop(session: ChatSession) -> tuple[list, list, str, str]:
    """Stop a turn: both panels as generated so far, and what was measured before the stop (native, codec)."""
    last = session.stop()
    native, codec = chat_panels(session)
    return native, codec, stopped_markdown(last, "native"), stopped_markdown(last, "codec")


def end_session(session: ChatSession | None) -> None:
    """Forget a conversation (Clear, a closed tab, an expired session): both caches released, off the idle list.
    A tab that never chatted holds None: nothing to forget."""
    if not isinstance(session, ChatSession):
        return
    session.clear()
    IDLE.forget(session)


def model_shape(name: str) -> tuple[int, int]:
    """(layers, KV heads) of a model, for the Inspect sliders at build time, from its config alone (the weights load
    in the background); (1, 1) if it cannot be read (the model panel says why when the page loads)."""
    try:
        config = model_config(name).get_text_config(decoder=True)
    except (ModelUnavailableError, ValueError, OSError):
        return 1, 1
    return config.num_hidden_layers, config.num_key_value_heads


def loading_note(pool, name: str) -> str | None:
    """What a request says while its model is not loaded yet (None once it is): the first start converts it."""
    if pool.check(name) in pool.loaded_names():
        return None
    return f"*Loading {name} (its first start here converts the model once; later starts read the copy) …*"


def prepared(loaded: LoadedModel, tiers, report: Progress) -> None:
    """Wait until every PCA calibration `tiers` need is ready (computed in the background, one at a time), saying
    so through `report`."""
    for tier in tiers:
        if isinstance(tier, Tier):
            for line in PREPARATION.wait_for(loaded, tier):
                report(0, 1, f"preparing: {line}")


def preparation_text() -> str:
    """The background preparation still under way, for the tier picker ("" once every tier is ready)."""
    status = PREPARATION.status_text()
    return f"Preparing in the background: {status}" if status else ""


def chat_request(pool, model_name: str, session: ChatSession, user: str, shown: str, tier: Tier, max_new_tokens: int,
                 decoded_view: bool, limits: Limits) -> Iterator[tuple[list, list, str, str]]:
    """One chat turn from the model's name: says at once when the model is still loading (a fresh Space's first
    request), then chat_stream on it; a decoded view only where asked (else on the codes where the tier allows)."""
    note = loading_note(pool, model_name)
    if note:
        native, codec = chat_panels(session, (shown, "", ""))
        yield native, codec, note, note
    with pool.lease(model_name) as loaded:
        on_codes = False if decoded_view is True else None
        yield from chat_stream(loaded, session, user, shown, tier, max_new_tokens, on_codes, limits)


def chat_stream(loaded: LoadedModel, session: ChatSession, user: str, shown: str, tier: Tier, max_new_tokens: int,
                materialization_free: bool, limits: Limits) -> Iterator[tuple[list, list, str, str]]:
    """One chat turn as what the two panels and their stats lines show: (native, codec, native stats, codec stats).

    The turn stops when the request's time budget runs out; the stats then say what was measured before.
    """
    deadline = limits.deadline()
    fits_model(tier, loaded.info)
    preparing = PREPARATION.not_ready(loaded, tier)  # "" when every calibration the tier needs is ready
    if preparing and may_archive(loaded, session, user, tier, max_new_tokens, limits):
        for line in PREPARATION.wait_for(loaded, tier):  # a PCA tier's calibration, computed once, in turn
            deadline.check()
            native, codec = chat_panels(session, (shown, "", ""))
            note = f"*Preparing this tier before the turn: {line}*"
            yield native, codec, note, note
    elif preparing:
        native, codec = chat_panels(session, (shown, "", ""))
        note = (f"*{tier.name} is still being prepared ({preparing}); this turn holds its tokens raw, which needs no "
                f"calibration (raw until {tokens_before_coder(tier):,} tokens)*")
        yield native, codec, note, note
    IDLE.busy(session)  # not evictable while this turn runs
    cancelled = False
    try:
        turn = session.ask(loaded, user, tier, max_new_tokens, materialization_free, shown, limits.max_prompt_tokens)
        for update in turn:
            native, codec = chat_panels(session, (shown, update.native.text, update.codec.text))
            if deadline.passed:
                last = session.stop()
                budget = f" (its time budget of {limits.max_request_seconds} s ran out)"
                native, codec = chat_panels(session)
                yield native, codec, stopped_markdown(last, "native") + budget, stopped_markdown(last, "codec") + budget
                return
            if update.result is None:
                waiting = progress_markdown(update)
                yield native, codec, waiting, waiting
            else:
                note = session_markdown(session, update.result)
                yield native, codec, native_stats_markdown(update.result), note + codec_stats_markdown(update.result)
    except GeneratorExit:
        # Cancelled (Stop, Clear, a closed tab): Gradio drops the generator and this runs when it is collected,
        # maybe during the session's next turn, whose caches are not this turn's to put at rest.
        cancelled = True
        raise
    finally:
        if not cancelled:
            IDLE.rest(session, limits.max_idle_mib)  # between turns: at rest, and all idle sessions bounded


def may_archive(loaded: LoadedModel, session: ChatSession, user: str, tier: Tier, max_new_tokens: int,
                limits: Limits) -> bool:
    """Whether this turn's codec cache may archive, for which a PCA tier needs its calibration: it holds the whole
    conversation and the reply, raw until tokens_before_coder (cache/pca_layer.py). A schedule always may."""
    if tier.joint is None or tier.per_layer:
        return True
    prompt = prompt_ids(loaded, session.messages(user), max_new_tokens, limits.max_prompt_tokens).shape[1]
    return prompt + max_new_tokens > tokens_before_coder(tier)


def ready_now(loaded: LoadedModel, tier: Tier, action: str) -> None:
    """Refuse `action` (which shows no progress) while `tier`'s calibration is still being prepared, saying how far."""
    line = PREPARATION.not_ready(loaded, tier)
    if line:
        raise ValueError(f"{tier.name} is still being prepared ({line}): {action} once it is ready")


RESUME_GPU_SECONDS = estimate_seconds(forwards=Limits().max_prompt_tokens // 512 + 1)  # the native re-prefill
DOWNLOAD_GPU_SECONDS = estimate_seconds(forwards=1)  # copying the cache off the GPU


def saved_model(session) -> str:
    """The model of the conversation a download saves; a ValueError before its first finished turn."""
    if not isinstance(session, ChatSession) or session.setup is None:
        raise ValueError("nothing to save yet: the conversation needs a finished turn first")
    return session.setup[0]


def chat_download(loaded: LoadedModel, session: ChatSession, folder: Path) -> str:
    """The codec cache of the conversation and its exchanges, written to a .kvc file in folder: its path."""
    path = folder / "conversation.kvc"
    if session.setup is not None:
        ready_now(loaded, session.setup[1], "download the cache")
    session.save(path, loaded)
    return str(path)


def chat_resume(loaded: LoadedModel, session: ChatSession, upload, limits: Limits) -> tuple:
    """Continue a conversation from an uploaded .kvc file: (native panel, codec panel, native note, codec note,
    tier name, whether attention reads the codes), the last two for the Chat's controls.

    The codec cache comes from the file (every check of cache/saved_load.py, within the operator's size cap); the
    native cache is re-prefilled from the saved token ids. On any error the session is left as it was.
    """
    path = saved_cache_file(upload, limits.max_cache_file_bytes)
    tier = tier_from_spec(read_header(path, limits.max_cache_file_bytes)[0].get("tier"))
    if TIERS.get(tier.name) != tier:
        kind = "a per-layer schedule" if tier.per_layer else "a custom tier"
        raise ValueError(f"this file was saved with {kind} ('{tier.name}'), which the Chat cannot select "
                         "again (allowed: a preset tier; a library user loads it with codeckv.load_cache)")
    ready_now(loaded, tier, "resume this conversation")
    resumed = session.resume(loaded, path, limits.max_cache_file_bytes, limits.max_prompt_tokens)
    IDLE.rest(session, limits.max_idle_mib)  # idle until its next turn: at rest, counted with the other sessions
    native, codec = chat_panels(session)
    if resumed.restore_s:
        rebuilt = f"its decoded view rebuilt in {1000 * resumed.restore_s:.0f} ms"
    else:
        rebuilt = "attention reads the stored codes (no view to rebuild)"
    codec_note = (f"Resumed from **{path.name}** ({resumed.file_bytes / 2**20:.1f} MiB): the {tier.name} cache of "
                  f"{resumed.tokens:,} tokens loaded from the file in {resumed.load_s:.2f} s, {rebuilt}. "
                  "The next message continues this conversation.")
    native_note = (f"Resumed: the native cache re-prefilled from the {resumed.tokens:,} saved token ids in "
                   f"{resumed.native_prefill_s:.2f} s.")
    return native, codec, native_note, codec_note, tier.name, session.setup[2] is None


def inspect_request(loaded: LoadedModel, prompt: str, tier: Tier, layer, head, which,
                    limits: Limits) -> tuple[dict[str, go.Figure], str]:
    """The Inspect figures of one tier on a text, and a one-line summary of the chosen (layer, head)."""
    fits_model(tier, loaded.info)
    which = one_of(which, "tensor", ("K", "V"))
    layer = whole(layer, "layer", 0, len(loaded.info.layer_types) - 1)
    head = whole(head, "KV head", 0, loaded.info.num_kv_heads - 1)
    deadline = limits.deadline()
    prepared(loaded, [tier], lambda *_: deadline.check())  # Inspect shows no progress: it waits
    view = inspect_tier(loaded, prompt_ids(loaded, prompt, limit=limits.max_inspect_tokens), tier, layer=layer,
                        head=head)
    figures = inspect_figures(view)
    figures["heatmap"] = figures["heatmap_key" if which == "K" else "heatmap_value"]
    return figures, inspect_summary(view, tier.name, layer, head)


def sweep_token_kld(result, tier) -> go.Figure | None:
    """Per-token KL divergence of one swept tier (None until a sweep ran, or for native)."""
    names = [r.tier for r in result.rows] if result is not None else []
    return token_kld_figure(result, tier) if tier in names and tier != "native" else None


def fresh_stop(flag) -> StopFlag:
    """The session's StopFlag (a fresh one for an API caller without a session), reset for a new run."""
    flag = flag if isinstance(flag, StopFlag) else StopFlag()
    flag.reset()
    return flag
