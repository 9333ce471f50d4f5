"""RULER-style long-context scores per tier, one native prefill per sample serving every tier.

    rows = ruler_grid(loaded, [get_tier("turbo-4"), get_tier("snapkv-50")], tasks=["niah_single_2", "vt"],
                      lengths=[4096], samples=4)
    rows[0].score, rows[0].score_se     # RULER's score (0-100) and its standard error over the samples

For each (length, task) the samples are generated (measure/long_tasks/: deterministic for the seed, the same for
every tier) and, per sample, the context is prefilled natively once (measure/shared_prefill.py). Each tier's cache
is then built from that prefill, as if the context had been prefilled through it in one forward: a codec encodes
the native keys and values, a press scores them with the queries the prefill captured and keeps its share (the
"once" protocol, kvpress's). The question and the answer prefix follow unpressed, tier by tier; then every tier's
answer is decoded greedily at once, one batch row per tier (a CPU decode step is bound by reading the weights), up
to the task's budget or an end-of-turn token, and scored as RULER scores it. So a tier pays only for its
conversion, the question and its answer (decoding stops once every expected string has appeared: the score could
not change after it), and `seconds` says so: the tier's own work (in each decode step, its own cache work and an
even share of the rest of the step: the weights' products serve every row), summed over the samples (a tier's
calibration, computed once per model, is done before any sample and counted in none); native's row adds the
shared prefill, and `prefill_share` is a tier's own seconds over the prefill's.

press_mode "chunked" measures the memory-bounded streaming mode instead: a press's cache prefills the context itself
in PREFILL_CHUNK-token chunks, each pressed as it arrives (its own prefill is then in its seconds), as does a token
budget under either mode. Peers: transformers' QuantizedCache backends are filled from the native prefill;
llama.cpp's KV types (measure/llamacpp.py) answer in llama.cpp from the same prompt ids, their prefill their own.
`stored_vs_bf16` (codecs: kept share x steady-state bytes; a press alone: the share it keeps) and `held_bytes` (every
tensor the cache owns) are read after the context, before the question, and averaged over the samples.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import asdict, dataclass

import torch

from codeckv.cache import footprint, held_bytes, make_cache
from codeckv.cache.attention import use_codec_attention
from codeckv.cache.calibration import calibration_for
from codeckv.cache.stacked import StackedCache
from codeckv.loaded import LoadedModel
from codeckv.measure.generate import next_logits, stop_token_ids
from codeckv.measure.llamacpp import LLAMACPP_REFERENCE, KVGeometry, LlamaCppPeer, open_engine, rule_bytes_per_token
from codeckv.measure.long_tasks import TASK_NAMES, long_sample, long_task, string_match_all
from codeckv.measure.long_tasks.haystack import DEFAULT_HAYSTACK, haystack_text
from codeckv.measure.peers import Peer, absent_reason, filled_peer_cache, peer_footprint
from codeckv.measure.shared_prefill import SharedPrefill, shared_prefill
from codeckv.measure.side_by_side import PREFILL_CHUNK
from codeckv.presses import Budget, Decoding, check_press_mode
from codeckv.tiers import TIERS, Tier

Progress = Callable[[int, int, str], None]  # (samples done, samples in all, message); may raise to stop
MAX_SAMPLES = 500
MIN_LENGTH = 256
FOUND_CHECK_EVERY = 4  # answer tokens between two looks for the expected strings


@dataclass
class RulerRow:
    task: str
    length: int  # tokens asked for: prompt + the task's answer budget fit within it
    tier: str
    samples: int
    score: float  # RULER's score, 0-100, mean over the samples
    score_se: float  # its standard error over the samples (nan with one sample)
    seconds: float  # the tier's own work over the samples (native's includes the shared prefill)
    prefill_share: float  # the tier's own seconds / the shared native prefill's
    stored_vs_bf16: float  # what the cache stores per token seen vs bf16 after the context (mean)
    held_bytes: int  # every tensor the cache owned after the context (mean); 0 for llama.cpp (its buffers are its own)
    prompt_tokens: float  # context + question tokens (mean)
    press_mode: str  # "once" or "chunked" for a press, "budget" for a token budget, "decoding"; "" otherwise
    seed: int
    haystack: str


@dataclass
class RulerSampleRow:
    """One tier's answer to one sample: the grid's cell (a sample) gives one per tier; summarize() averages them."""

    task: str
    length: int
    sample: int  # the sample's index: (task, length, seed, sample, haystack) draws it
    tier: str
    score: float  # RULER's score of this answer, 0-100
    seconds: float  # the tier's own work (cache built, question, its share of the decode steps), not the prefill
    prefill_seconds: float  # the shared native prefill of this sample (0 where no tier read one)
    stored_vs_bf16: float  # what the cache stores per token seen vs bf16 after the context
    held_bytes: int  # every tensor the cache owned after the context; 0 for llama.cpp (its buffers are its own)
    prompt_tokens: int
    press_mode: str
    seed: int
    haystack: str


_NUMERIC = ("score", "seconds", "prefill_seconds", "stored_vs_bf16", "held_bytes", "prompt_tokens")
RowKey = tuple[str, int, str]  # (task, length, tier)


def row_key(row: RulerRow | dict) -> RowKey:
    row = row if isinstance(row, dict) else asdict(row)
    return str(row["task"]), int(row["length"]), str(row["tier"])


def check_grid(model: str, max_context: int, tasks: list[str], lengths: list[int], samples: int) -> None:
    """A ValueError for a task, length or sample count this runner and a model of `max_context` tokens cannot take
    (the CLI asks before loading the model, from its config)."""
    for task in tasks:
        if task not in TASK_NAMES:
            raise ValueError(f"unknown task {task!r} (allowed: {', '.join(TASK_NAMES)})")
    for length in lengths:
        if not MIN_LENGTH <= length <= max_context:
            raise ValueError(f"length {length} is outside {MIN_LENGTH}..{max_context}, the context {model} takes")
    if not 1 <= samples <= MAX_SAMPLES:
        raise ValueError(f"samples={samples} must be in 1..{MAX_SAMPLES}")


def press_mode_of(tier, press_mode: str) -> str:
    """How a tier's press acts here: "decoding" for a decoding press (its cache built from the shared prefill, which
    it leaves alone), "budget" for a token budget, `press_mode` for another press, "" without one."""
    if not getattr(tier, "evicts", False):
        return ""
    if isinstance(tier.press, Decoding):
        return "decoding"
    return "budget" if isinstance(tier.press, Budget) else press_mode


@dataclass
class _Answer:
    """A tier's answer under way: its cache (context and question fed), the tokens so far, its share of the steps."""

    name: str
    cache: object
    tokens: list[int]
    seconds: float = 0.0


@torch.inference_mode()
def _first_token(loaded: LoadedModel, cache, question: torch.Tensor) -> int:
    """Feed the question after the context a cache holds; the answer's first token (greedy)."""
    return int(next_logits(loaded.model, question, cache)[0].argmax())


def _finished(loaded: LoadedModel, tokens: list[int], budget: int, stop_ids, outputs) -> bool:
    """At the budget, an end of turn, or (looked at every FOUND_CHECK_EVERY tokens) every expected string found:
    RULER's score only counts strings found, so the tokens after that could not change it (a wrong answer runs to
    the budget)."""
    if tokens[-1] in stop_ids or len(tokens) >= budget:
        return True
    return len(tokens) % FOUND_CHECK_EVERY == 0 and string_match_all(_text(loaded, tokens), outputs) == 100.0


@torch.inference_mode()
def _decode_together(loaded: LoadedModel, answers: list[_Answer], budget: int, stop_ids, outputs) -> None:
    """Decode every answer greedily to its end (`_finished`), one batch row per tier (cache/stacked.py): a CPU decode
    step is bound by reading the weights, so one step of N tiers costs little more than one tier's. A tier is
    charged, per step, its own cache work (its updates, its attention and what that archives: the stack's
    member_seconds) and an even share of the rest of the step (the weights' products, which serve every row); a
    tier leaves the batch when it finishes. Every tier has seen as many tokens as the others at each step, so
    positions agree (a press's evicted tokens still count, layers.get_seq_length), and a one-token query needs no
    mask: each member attends to all it holds."""
    use_codec_attention(loaded.model)
    device = loaded.model.device
    going = [a for a in answers if not _finished(loaded, a.tokens, budget, stop_ids, outputs)]
    while going:
        start = time.perf_counter()
        ids = torch.tensor([[a.tokens[-1]] for a in going], device=device)
        stacked = StackedCache([a.cache for a in going], rows=1)
        logits = next_logits(loaded.model, ids, stacked)
        for answer, token in zip(going, logits.argmax(-1).tolist()):
            answer.tokens.append(int(token))
        own = stacked.member_seconds
        share = max(time.perf_counter() - start - sum(own), 0.0) / len(going)
        for answer, mine in zip(going, own):
            answer.seconds += mine + share
        going = [a for a in going if not _finished(loaded, a.tokens, budget, stop_ids, outputs)]


def _text(loaded: LoadedModel, tokens: list[int]) -> str:
    return loaded.tokenizer.decode(tokens, skip_special_tokens=True)


@torch.inference_mode()
def _own_prefill(loaded: LoadedModel, tier: Tier, context: torch.Tensor):
    """A press's cache prefilling the context itself, every PREFILL_CHUNK tokens pressed as they arrive."""
    cache = make_cache(loaded, tier, press_mode="chunked")
    for lo in range(0, context.shape[1], PREFILL_CHUNK):
        next_logits(loaded.model, context[:, lo : lo + PREFILL_CHUNK], cache)
    return cache


def tier_cache(loaded: LoadedModel, tier, prefill: SharedPrefill | None, context: torch.Tensor, press_mode: str):
    """(cache holding the context, stores vs bf16) for a tier or transformers peer."""
    if isinstance(tier, Peer):
        cache = filled_peer_cache(prefill.native, loaded.model.config, tier)
        return cache, peer_footprint(cache).ratio
    if press_mode_of(tier, press_mode) in ("chunked", "budget"):
        cache = _own_prefill(loaded, tier, context)
    else:
        cache = prefill.native if tier.is_native else prefill.cache_for(tier)
    return cache, footprint(cache).stored_ratio(tier.coded)


def grid_tiers(loaded: LoadedModel, tiers: list[Tier | Peer | LlamaCppPeer], press_mode: str) -> list:
    """The tiers of a grid checked and ready, native last (it answers in the prefill's own cache): a peer that cannot
    run here refused, and every calibration (a PCA basis, FP8 scales: minutes, once per model) done before any
    sample, so none is counted in a sample's seconds."""
    check_press_mode(press_mode)
    tiers = [t for t in tiers if not t.is_native] + [TIERS["native"]]
    for tier in tiers:
        if isinstance(tier, Peer | LlamaCppPeer) and (reason := absent_reason(tier, loaded.info)):
            raise ValueError(reason)
    for tier in tiers:
        if isinstance(tier, Tier):
            calibration_for(loaded, tier)
    return tiers


def open_engines(stack: ExitStack, tiers: list, model: str, n_ctx: int) -> dict:
    """llama.cpp's engine per llama.cpp type among `tiers`, on as many threads as torch (so their seconds compare),
    closed with `stack`."""
    return {t.name: stack.enter_context(open_engine(t, model, n_ctx=n_ctx, n_threads=torch.get_num_threads()))
            for t in tiers if isinstance(t, LlamaCppPeer)}


def ruler_sample(loaded: LoadedModel, tiers: list, task: str, length: int, index: int, seed: int = 0,
                 haystack: str = DEFAULT_HAYSTACK, press_mode: str = "once", engines: dict | None = None,
                 say: Callable[[str], None] = lambda message: None) -> list[RulerSampleRow]:
    """Sample `index` of `task` at `length`, every tier of `tiers` (from grid_tiers; llama.cpp's in `engines`)
    answering it: one row per tier, native's last. `say` hears each stage (a place to stop)."""
    sample = long_sample(task, loaded.tokenizer, length, seed, index, haystack)
    context = sample.context_ids.to(loaded.model.device)
    question = sample.question_ids.to(loaded.model.device)
    shared = [t for t in tiers if not isinstance(t, LlamaCppPeer) and press_mode_of(t, press_mode) not in
              ("chunked", "budget")]
    where = f"{task} at {length} tokens, sample {index + 1}"
    say(f"{where}: prefilling {context.shape[1]:,} tokens" if shared else where)
    prefill, prefill_seconds = None, 0.0  # no tier reads a shared prefill (llama.cpp's, chunked presses): none
    if shared:
        start = time.perf_counter()
        prefill = shared_prefill(loaded, context, capture_queries=any(press_mode_of(t, press_mode) == "once"
                                                                      for t in shared))
        prefill_seconds = time.perf_counter() - start
    geometry = KVGeometry(len(loaded.info.layer_types), loaded.info.num_kv_heads, loaded.info.head_dim)
    rows, answers = {}, []
    for tier in tiers:
        say(f"{where}: {tier.name}")
        start = time.perf_counter()
        row = RulerSampleRow(task, length, index, tier.name, math.nan, 0.0, prefill_seconds, 1.0, 0,
                             sample.prompt_tokens, press_mode_of(tier, press_mode), seed, haystack)
        if isinstance(tier, LlamaCppPeer):
            ids = torch.cat([sample.context_ids, sample.question_ids], dim=1)[0].tolist()
            row.score = string_match_all(engines[tier.name].greedy(ids, sample.answer_tokens).text, sample.outputs)
            row.stored_vs_bf16 = (rule_bytes_per_token(tier, geometry)
                                  / rule_bytes_per_token(LLAMACPP_REFERENCE, geometry))
        else:
            cache, row.stored_vs_bf16 = tier_cache(loaded, tier, prefill, context, press_mode)
            row.held_bytes = held_bytes(cache) if not isinstance(tier, Peer) else peer_footprint(cache).resident_bytes
            answers.append(_Answer(tier.name, cache, [_first_token(loaded, cache, question)]))
        row.seconds = time.perf_counter() - start
        rows[tier.name] = row
    del prefill  # its captured queries (the presses are built): the answers hold every cache they need
    say(f"{where}: {len(answers)} answers decoding together")
    _decode_together(loaded, answers, sample.answer_tokens, stop_token_ids(loaded.tokenizer, loaded.model),
                     sample.outputs)
    for answer in answers:
        rows[answer.name].seconds += answer.seconds
        rows[answer.name].score = string_match_all(_text(loaded, answer.tokens), sample.outputs)
    return list(rows.values())


def ruler_grid(
    loaded: LoadedModel,
    tiers: list[Tier | Peer | LlamaCppPeer],
    tasks: Iterable[str] = TASK_NAMES,
    lengths: Iterable[int] = (4096,),
    samples: int = 4,
    seed: int = 0,
    haystack: str = DEFAULT_HAYSTACK,
    press_mode: str = "once",
    progress: Progress | None = None,
) -> list[RulerRow]:
    """Native and every tier on `samples` samples of every task at every length (module docstring), in this
    process: one row per (task, length, tier). The CLI runs the same samples as grid cells (ruler_job.py)."""
    tasks, lengths = list(tasks), list(lengths)
    check_grid(loaded.info.name, loaded.info.max_context, tasks, lengths, samples)
    haystack_text(haystack)  # a bad file fails here, before any prefill
    tiers = grid_tiers(loaded, tiers, press_mode)
    total, done, rows = len(tasks) * len(lengths) * samples, 0, []

    def say(message: str) -> None:  # also where a stop or the app's deadline interrupts
        if progress:
            progress(done, total, message)

    with ExitStack() as stack:
        engines = open_engines(stack, tiers, loaded.info.name, max(lengths))
        for length in lengths:
            for task in tasks:
                for index in range(samples):
                    rows += ruler_sample(loaded, tiers, task, length, index, seed, haystack, press_mode, engines, say)
                    done += 1
                    say(f"{task} at {length} tokens, sample {index + 1}/{samples}")
    return summarize([asdict(row) for row in rows])


def summarize(rows: list[dict]) -> list[RulerRow]:
    """Per-sample rows (RulerSampleRow's columns, read from a CSV or not) as one row per (task, length, tier): the
    mean score and its standard error over the samples, the seconds summed (native's with the shared prefills)."""
    groups: dict[RowKey, list[dict]] = {}
    for row in rows:
        groups.setdefault(row_key(row), []).append(row)
    summary = []
    for (task, length, tier), texts in groups.items():
        group = [{column: float(row[column]) for column in _NUMERIC} for row in texts]
        n, scores = len(group), [row["score"] for row in group]
        own, prefill = sum(row["seconds"] for row in group), sum(row["prefill_seconds"] for row in group)
        first = texts[0]
        summary.append(RulerRow(
            task, length, tier, n, statistics.fmean(scores),
            statistics.stdev(scores) / math.sqrt(n) if n > 1 else math.nan,
            own + (prefill if tier == "native" else 0.0), own / prefill if prefill else math.nan,
            statistics.fmean(row["stored_vs_bf16"] for row in group),
            int(statistics.fmean(row["held_bytes"] for row in group)),
            statistics.fmean(row["prompt_tokens"] for row in group),
            str(first["press_mode"]), int(first["seed"]), str(first["haystack"])))
    return summary


def task_line(name: str) -> str:
    """What a task tests, in a line (for tables and the app)."""
    return long_task(name, 4096).tests


def as_dicts(rows: list[RulerRow]) -> list[dict]:
    return [asdict(r) for r in rows]
