"""What each app request does, from the raw values a browser or an API caller sends to measured results.

    outcome = sweep_request(loaded, LONG_TEXT, source=..., windows=2, length=512, tiers=[...], progress=cb)
    grid = needle_request(loaded, ["512", "1024"], ["0%", "100%"], ["turbo-4"], progress=cb)
    native, codec = chat_panels(session)

Every value is checked here or in codeckv/inputs.py before it reaches a loader, a loop or an
allocation, and every request runs under the budgets of codeckv/limits.py; app.py only maps these
results onto its components.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import plotly.graph_objects as go

from codeckv.figures import quality_figures, sweep_figures
from codeckv.formatting import quality_table, sweep_table
from codeckv.inputs import one_of, read_text_file, tier_names, user_text, whole
from codeckv.limits import Deadline, Limits, StopFlag
from codeckv.measure.chat import ChatSession
from codeckv.measure.needle import NeedleGrid, needle_grid
from codeckv.measure.quality import QualityRun, measure_quality
from codeckv.measure.quality import as_dicts as quality_dicts
from codeckv.measure.sweep import Sweep, sweep
from codeckv.measure.sweep import as_dicts as sweep_dicts
from codeckv.models import LoadedModel
from codeckv.zerogpu import MAX_SECONDS, estimate_seconds

LONG_TEXT = "long text: KL divergence, top-1, ΔNLL with their spread over windows"
ONE_PROMPT = "one chat prompt: latency, token match, first divergence (a single sample)"
SOURCES = {"embedded corpus (Python reference)": "corpus", "held-out text (stdlib docstrings)": "docstrings",
           "pasted text": "pasted", "uploaded file": "file"}
METRICS = {"KL divergence": "kld", "ΔNLL": "delta_nll_pct"}
NEEDLE_LENGTHS = (512, 1024, 2048, 4096, 8000)
NEEDLE_DEPTHS = ("0%", "25%", "50%", "75%", "100%")
Progress = Callable[[int, int, str], None]


@dataclass
class SweepOutcome:
    result: QualityRun | Sweep
    table: dict  # {"headers": [...], "data": [[...]]}
    figures: dict[str, go.Figure]
    rows: list[dict]  # for CSV / JSON
    about: dict  # what was measured, for the JSON report


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
    mode, tiers = one_of(mode, "mode", (LONG_TEXT, ONE_PROMPT)), tier_names(tiers)
    report = until(limits.deadline(), progress, stop)
    if mode == ONE_PROMPT:
        prompt = user_text(prompt)
        new_tokens = whole(new_tokens, "new tokens per tier", 1, min(128, limits.max_new_tokens))
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
    result = measure_quality(loaded, tiers, windows, length, "corpus" if text else kind, text, report)
    about = {"mode": "long text", "source": kind, "windows": windows, "tokens_per_window": length}
    return SweepOutcome(result, quality_table(result.rows), quality_figures(result), quality_dicts(result.rows), about)


def chat_gpu_seconds(message, document, upload, model_name, tier_name, max_new_tokens, *rest) -> int:
    """The ZeroGPU slot a chat turn asks for (codeckv.zerogpu): prompt chunks at the prompt limit plus three
    forwards per new token (native, codec, the teacher-forced native reply); garbage asks for the most."""
    limits = Limits.from_env()
    try:
        new_tokens = whole(max_new_tokens, "max new tokens", 1, limits.max_new_tokens)
    except ValueError:
        new_tokens = limits.max_new_tokens  # the handler refuses it; the slot just must not be too short
    return estimate_seconds(forwards=limits.max_prompt_tokens // 512 + 3 * new_tokens)


INSPECT_GPU_SECONDS = estimate_seconds(forwards=2 * Limits().max_inspect_tokens // 512)  # two prefills
LONG_GPU_SECONDS = MAX_SECONDS  # a sweep or a needle grid asks for the longest slot a visitor may hold


def needle_cells(lengths, depths, limits: Limits | None = None) -> tuple[list[int], list[float]]:
    """The chosen lengths (tokens) and depths (fractions), checked against the choices and the budget."""
    limits = limits or Limits.from_env()
    if not isinstance(lengths, list | tuple) or not lengths or not isinstance(depths, list | tuple) or not depths:
        raise ValueError("choose at least one length and one depth")
    lengths = sorted({int(one_of(str(n), "prompt tokens", map(str, NEEDLE_LENGTHS))) for n in lengths})
    depths = sorted({float(one_of(d, "depth", NEEDLE_DEPTHS).rstrip("%")) / 100 for d in depths})
    if sum(lengths) * len(depths) > limits.max_needle_tokens:
        raise ValueError(f"{len(lengths) * len(depths)} cells of {sum(lengths) * len(depths):,} prompt tokens in "
                         f"all, more than the {limits.max_needle_tokens:,} allowed per request here: choose fewer")
    return lengths, depths


def needle_request(loaded: LoadedModel, lengths, depths, tiers, progress: Progress | None = None,
                   limits: Limits | None = None, stop: StopFlag | None = None) -> NeedleGrid:
    """Pass-key retrieval of native and every chosen tier over the chosen lengths and depths."""
    limits = limits or Limits.from_env()
    lengths, depths = needle_cells(lengths, depths, limits)
    tiers = tier_names(tiers, allow_native=False) if tiers else []
    return needle_grid(loaded, tiers, lengths, depths, until(limits.deadline(), progress, stop))


def needle_table(grid: NeedleGrid) -> dict:
    """The grid's answers as a display table."""
    data = [[r.tier, r.tokens, f"{r.depth:.0%}", r.key, "yes" if r.retrieved else "no", r.answer] for r in grid.rows]
    return {"headers": ["tier", "prompt tokens", "depth", "key", "retrieved", "answer"], "data": data}


def chat_panels(session: ChatSession, pending: tuple[str, str, str] | None = None) -> tuple[list, list]:
    """The two chat panels: every exchange so far (the native and the codec side), then the turn in progress."""
    native, codec = [], []
    turns = [(e.shown, e.native, e.codec) for e in session.exchanges] + ([pending] if pending else [])
    for shown, native_reply, codec_reply in turns:
        native += [{"role": "user", "content": shown}, {"role": "assistant", "content": native_reply}]
        codec += [{"role": "user", "content": shown}, {"role": "assistant", "content": codec_reply}]
    return native, codec
