"""Long generations: every tier solves word problems with chain of thought, followed along its own generation.

    rows = reasoning_grid(loaded, [get_tier("turbo-3"), get_tier("tova-budget256")], samples=8, steps=(3, 5))
    summary = summarize(rows)          # per tier: accuracy, agreement and flips against native, first departure, KLD
    curve = kld_curve(rows)            # per tier and 32-token span of the generation: KLD and top-1

Each problem (measure/reasoning_tasks/) is a few-shot prompt: the worked examples are the context, prefilled
natively once and shared by every tier as the RULER grid shares it (a codec encodes native's keys and values, a
prefill press scores them with the captured queries; a token budget prefills the context itself, chunk by chunk,
and keeps pressing while it decodes). Every tier is then fed the problem's turn and decodes greedily, all of them
in one batch, one row a tier, to the budget, an end-of-turn token or lm-eval's stop string.

Following a tier along its own path: at every generated position its next-token distribution is compared with
native's on the same tokens (the tier's own), as the quality tables compare them: KL(native || tier) in nats and
top-1 agreement. While a tier's tokens equal native's own greedy tokens, native's own row is that reference; at
the first token where they part (its first departure), a copy of native's cache as it stood before that token
(holding exactly the tokens the tier's holds) joins the batch and is fed the tier's tokens from then on. So the
reference costs a row only for the tiers that have departed, and it is exact: the same model, native cache, the
tier's tokens. The curve is the mean of each problem's KLD over the positions of a CURVE_SPAN-token span.

llama.cpp's KV types answer in llama.cpp from the same prompt ids and are compared with llama.cpp's own f16 run
(answer agreement, flips, first departure), as in the quality tables; llama.cpp gives no KLD along the way here.
A tier's `seconds` are its own cache work in each step and an even share of the rest of the step among the tier
rows (the reference rows are the measurement's cost, not the tier's), plus its conversion or own prefill;
native's add the shared prefill.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field

import torch

from codeckv.cache import footprint, held_bytes
from codeckv.cache.attention import use_codec_attention
from codeckv.cache.calibration import calibration_for
from codeckv.cache.stacked import StackedCache
from codeckv.loaded import LoadedModel
from codeckv.measure.generate import next_logits, stop_token_ids
from codeckv.measure.llamacpp import LLAMACPP_REFERENCE, KVGeometry, LlamaCppPeer, open_engine, rule_bytes_per_token
from codeckv.measure.lockstep import kl_divergence
from codeckv.measure.peers import Peer, absent_reason, peer_footprint
from codeckv.measure.reasoning_summary import CURVE_SPAN
from codeckv.measure.reasoning_tasks.answers import cut_at_stop, flexible_answer, has_stop, is_correct, strict_answer
from codeckv.measure.reasoning_tasks.prompts import reasoning_prompt
from codeckv.measure.reasoning_tasks.word_problems import MAX_STEPS, MIN_STEPS, word_problem
from codeckv.measure.ruler import press_mode_of, tier_cache
from codeckv.measure.shared_prefill import shared_prefill
from codeckv.tiers import TIERS, Tier

Progress = Callable[[int, int, str], None]  # (problems done, problems in all, message); may raise to stop
MAX_SAMPLES = 5000
MIN_BUDGET, MAX_BUDGET = 8, 4096

NEVER = -1  # first_departure of a generation equal to its reference's


@dataclass
class ProblemRow:
    """One tier on one problem."""

    index: int
    steps: int
    tier: str
    reference: str  # whose greedy answer agreement, flips and departure compare with: native or llama.cpp's f16
    answer: int  # the right number
    strict: str  # lm-eval's strict-match extraction of the reply
    flexible: str  # and its flexible-extract
    correct: int  # 1 when the strict extraction is right
    correct_flexible: int
    answer_tokens: int  # generated tokens (the end-of-turn token excluded)
    first_departure: int  # first generated position where the greedy token differs from the reference's; NEVER
    kld: float  # mean KL(native || tier) over the generated positions, nats (nan for llama.cpp)
    top1: float  # % of those positions where the argmaxes agree
    kld_curve: str  # per CURVE_SPAN tokens: the mean KLD, ";"-separated
    top1_curve: str
    seconds: float
    stored_vs_bf16: float  # what the cache stores per token seen vs bf16 at the end of the reply
    held_bytes: int  # every tensor the cache owned at the end of the reply (0 for llama.cpp)
    prompt_tokens: int
    seed: int
    budget: int
    text: str  # the reply, cut at the stop string


RowKey = tuple[int, str]  # (problem index, tier)


def row_key(row: ProblemRow | dict) -> RowKey:
    row = row if isinstance(row, dict) else asdict(row)
    return int(row["index"]), str(row["tier"])


def steps_of(index: int, steps: tuple[int, ...]) -> int:
    """The step count of problem `index`: the --steps values in turn."""
    return steps[index % len(steps)]


def check_reasoning(samples: int, steps: tuple[int, ...], budget: int, max_context: int) -> None:
    """A ValueError for a sample count, step count or budget this grid cannot take (before any model work)."""
    if isinstance(samples, bool) or not isinstance(samples, int) or not 1 <= samples <= MAX_SAMPLES:
        raise ValueError(f"samples={samples!r} must be a whole number in 1..{MAX_SAMPLES}")
    if not steps:
        raise ValueError(f"give at least one step count ({MIN_STEPS}..{MAX_STEPS})")
    for count in steps:
        if isinstance(count, bool) or not isinstance(count, int) or not MIN_STEPS <= count <= MAX_STEPS:
            raise ValueError(f"steps={count!r} must be a whole number in {MIN_STEPS}..{MAX_STEPS}")
    top = min(MAX_BUDGET, max_context)
    if isinstance(budget, bool) or not isinstance(budget, int) or not MIN_BUDGET <= budget <= top:
        raise ValueError(f"budget={budget!r} must be a whole number in {MIN_BUDGET}..{top} (the model's context is "
                         f"{max_context} tokens)")


@dataclass
class _Run:
    """A tier's generation under way: its cache, tokens, and the reference that follows it."""

    tier: Tier | Peer
    cache: object
    tokens: list[int] = field(default_factory=list)
    shadow: object = None  # native's cache fed this tier's tokens, once it departs from native's own
    kld: list[float] = field(default_factory=list)  # one per generated token, the stop token's included
    top1: list[bool] = field(default_factory=list)
    seconds: float = 0.0


STOP_WINDOW = 8  # newest tokens searched for a stop string: it ends at the newest one, and spans fewer than this


def _ended(loaded: LoadedModel, tokens: list[int], budget: int, stop_ids) -> bool:
    """At an end-of-turn token, the budget, or a stop string the newest token completed (checked on the last
    STOP_WINDOW tokens only, so a decode step stays O(1) in the reply's length)."""
    return (tokens[-1] in stop_ids or len(tokens) >= budget
            or has_stop(_text(loaded, tokens[-STOP_WINDOW:])))


def _text(loaded: LoadedModel, tokens: list[int]) -> str:
    return loaded.tokenizer.decode(tokens, skip_special_tokens=True)


def _reply(loaded: LoadedModel, tokens: list[int], stop_ids) -> tuple[list[int], str]:
    """The generated ids without the end-of-turn token, and their text cut at the stop string."""
    kept = tokens[:-1] if tokens and tokens[-1] in stop_ids else tokens
    return kept, cut_at_stop(_text(loaded, kept))


def _judge(runs: list[_Run], logprobs: list[torch.Tensor], references: list[torch.Tensor]) -> None:
    """Each run's KLD and top-1 against its reference at this position, then its greedy token."""
    for run, mine, reference in zip(runs, logprobs, references):
        run.kld.append(float(kl_divergence(reference, mine)))
        run.top1.append(bool(reference.argmax() == mine.argmax()))
        run.tokens.append(int(mine.argmax()))


@torch.inference_mode()
def _follow(loaded: LoadedModel, runs: list[_Run], native: _Run, question: torch.Tensor, budget: int,
            stop_ids, on_step: Callable[[int, int], None] | None = None) -> None:
    """Feed every run the question (one forward each: their caches may hold different numbers of tokens), then
    decode all greedily together, one token a row, each followed by its reference (module docstring). native is
    the last of `runs`; `on_step(tokens so far, rows)` is called before each decode step (it may raise to stop)."""
    use_codec_attention(loaded.model)
    device = loaded.model.device
    first = []
    for run in runs:
        start = time.perf_counter()
        first.append(torch.log_softmax(next_logits(loaded.model, question.to(device), run.cache)[0], dim=-1).cpu())
        run.seconds += time.perf_counter() - start
    _judge(runs, first, [first[-1]] * len(runs))
    while going := [r for r in runs if not _ended(loaded, r.tokens, budget, stop_ids)]:
        if on_step:
            on_step(max(len(r.tokens) for r in going), len(going))
        for run in going:  # a run whose last token left native's path gets its reference now: native's cache before
            if run is not native and run.shadow is None and run.tokens != native.tokens[: len(run.tokens)]:
                run.shadow = copy.deepcopy(native.cache)  # this step holds what the run's holds
        shadows = [r for r in going if r.shadow is not None]
        ids = torch.tensor([[r.tokens[-1]] for r in [*going, *shadows]], device=device)
        start = time.perf_counter()
        stacked = StackedCache([r.cache for r in going] + [r.shadow for r in shadows], rows=1)
        logprobs = torch.log_softmax(next_logits(loaded.model, ids, stacked), dim=-1).cpu()  # (M, vocab)
        own = stacked.member_seconds
        share = max(time.perf_counter() - start - sum(own), 0.0) / len(going)
        for row, run in enumerate(going):
            run.seconds += own[row] + share
        if any(r.shadow is None for r in going) and native not in going:
            raise RuntimeError("a tier follows native's path but native has stopped")
        references = [logprobs[len(going) + shadows.index(r)] if r.shadow is not None
                      else logprobs[going.index(native)] for r in going]
        _judge(going, list(logprobs[: len(going)]), references)


def _first_departure(tokens: list[int], reference: list[int]) -> int:
    for position, (mine, theirs) in enumerate(zip(tokens, reference)):
        if mine != theirs:
            return position
    return NEVER if len(tokens) == len(reference) else min(len(tokens), len(reference))


def _curve(values: list[float]) -> str:
    spans = [values[lo : lo + CURVE_SPAN] for lo in range(0, len(values), CURVE_SPAN)]
    return ";".join(f"{statistics.fmean(span):.6g}" for span in spans)


def _llamacpp_reply(engine, prompt_ids: list[int], budget: int) -> tuple[list[int], str, float]:
    """llama.cpp's greedy reply, stopped as the torch runs stop (end of generation, budget, stop string)."""
    start = time.perf_counter()
    engine.reset()
    logits, ids = engine.feed(prompt_ids), []
    while True:
        token = int(logits.argmax())
        if engine.is_end(token):
            break
        ids.append(token)
        if len(ids) >= budget or has_stop(engine.detokenize(ids)):
            break
        logits = engine.feed([token])
    return ids, cut_at_stop(engine.detokenize(ids)), time.perf_counter() - start


def reasoning_tiers(loaded: LoadedModel, tiers: list[Tier | Peer | LlamaCppPeer]) -> tuple[list, list]:
    """(torch tiers with native last, llama.cpp types with its f16 first or none), checked and calibrated (a PCA
    basis or FP8 scales: once per model, before any problem)."""
    llama = [t for t in tiers if isinstance(t, LlamaCppPeer)]
    if llama:
        llama = [LLAMACPP_REFERENCE] + [t for t in llama if t.name != LLAMACPP_REFERENCE.name]
    torch_tiers = [t for t in tiers if not isinstance(t, LlamaCppPeer) and not t.is_native] + [TIERS["native"]]
    for tier in [*torch_tiers, *llama]:
        if isinstance(tier, Peer | LlamaCppPeer) and (reason := absent_reason(tier, loaded.info)):
            raise ValueError(reason)
    for tier in torch_tiers:
        if isinstance(tier, Tier):
            calibration_for(loaded, tier)
    return torch_tiers, llama


def open_reasoning_engines(stack: ExitStack, loaded: LoadedModel, llama: list, budget: int) -> dict:
    """llama.cpp's engine per type, on torch's threads, closed with `stack`."""
    return {t.name: stack.enter_context(open_engine(t, loaded.info.name, n_ctx=4096 + budget,
                                                    n_threads=torch.get_num_threads())) for t in llama}


def reasoning_problem(loaded: LoadedModel, torch_tiers: list, llama: list, engines: dict, index: int, seed: int = 0,
                      steps: tuple[int, ...] = (2, 3, 4), budget: int = 256, todo: set[str] | None = None,
                      say: Callable[[str], None] = lambda message: None) -> list[ProblemRow]:
    """Problem `index` answered by every tier of reasoning_tiers (llama.cpp's in `engines`): a row per tier in
    `todo` (every tier when None). The torch tiers follow native together, so they run whenever one is due."""
    problem = word_problem(seed, index, steps_of(index, steps))
    prompt = reasoning_prompt(loaded.tokenizer, problem)
    if prompt.tokens + budget > loaded.info.max_context:
        raise ValueError(f"a prompt of {prompt.tokens} tokens and a budget of {budget} pass the model's "
                         f"context of {loaded.info.max_context} tokens")
    due = (lambda name: True) if todo is None else todo.__contains__
    where = f"problem {index + 1} ({problem.steps} steps)"
    replies: list[_Reply] = []
    if any(due(t.name) for t in torch_tiers):
        say(f"{where}: prefilling {prompt.context_ids.shape[1]} tokens")
        stop_ids = stop_token_ids(loaded.tokenizer, loaded.model)
        replies += _torch_replies(loaded, torch_tiers, prompt, budget, stop_ids, lambda tokens, going: say(
            f"{where}: {going} tiers decoding, token {tokens}/{budget}"))
    if any(due(t.name) for t in llama):
        say(f"{where}: llama.cpp")
        geometry = KVGeometry(len(loaded.info.layer_types), loaded.info.num_kv_heads, loaded.info.head_dim)
        replies += _llamacpp_replies(engines, llama, prompt, budget, geometry)
    return [_row(problem, index, prompt, seed, budget, reply) for reply in replies if due(reply.tier)]


def reasoning_grid(
    loaded: LoadedModel,
    tiers: list[Tier | Peer | LlamaCppPeer],
    samples: int = 8,
    seed: int = 0,
    steps: tuple[int, ...] = (2, 3, 4),
    budget: int = 256,
    progress: Progress | None = None,
) -> list[ProblemRow]:
    """Every tier (native always, llama.cpp's f16 whenever a llama.cpp type is asked) on problems 0..samples-1 of
    `seed` (module docstring), in this process: one ProblemRow per (problem, tier). The CLI runs the same problems
    as grid cells (reasoning_job.py)."""
    steps = tuple(steps)
    check_reasoning(samples, steps, budget, loaded.info.max_context)
    torch_tiers, llama = reasoning_tiers(loaded, tiers)
    rows: list[ProblemRow] = []
    done = 0

    def say(message: str) -> None:
        if progress:
            progress(done, samples, message)

    with ExitStack() as stack:
        engines = open_reasoning_engines(stack, loaded, llama, budget)
        for index in range(samples):
            rows += reasoning_problem(loaded, torch_tiers, llama, engines, index, seed, steps, budget, None, say)
            done += 1
            say(f"problem {index + 1}/{samples}")
    return rows


@dataclass
class _Reply:
    """A tier's reply to one problem, beside its reference's."""

    tier: str
    reference: str
    tokens: list[int]
    text: str
    departure: int
    kld: list[float]
    top1: list[bool]
    seconds: float
    stored: float
    held: int


def _torch_replies(loaded: LoadedModel, tiers: list, prompt, budget: int, stop_ids, on_step) -> list[_Reply]:
    """Every tier's reply from one shared native prefill of the worked examples, native last (module docstring)."""
    context = prompt.context_ids.to(loaded.model.device)
    shared = [t for t in tiers if press_mode_of(t, "once") != "budget"]
    start = time.perf_counter()
    prefill = shared_prefill(loaded, context, capture_queries=any(press_mode_of(t, "once") == "once" for t in shared))
    prefill_seconds = time.perf_counter() - start
    runs = []
    for tier in tiers:
        start = time.perf_counter()
        runs.append(_Run(tier, tier_cache(loaded, tier, prefill, context, "once")[0]))
        runs[-1].seconds = time.perf_counter() - start
    del prefill
    native = runs[-1]
    _follow(loaded, runs, native, prompt.question_ids, budget, stop_ids, on_step)
    native_tokens, _ = _reply(loaded, native.tokens, stop_ids)
    replies = []
    for run in runs:  # what each cache holds at the end of its reply: a decoding press has pressed by then
        tokens, text = _reply(loaded, run.tokens, stop_ids)
        seconds = run.seconds + (prefill_seconds if run is native else 0.0)
        if isinstance(run.tier, Peer):
            stored, held = peer_footprint(run.cache).ratio, peer_footprint(run.cache).resident_bytes
        else:
            stored, held = footprint(run.cache).stored_ratio(run.tier.coded), held_bytes(run.cache)
        replies.append(_Reply(run.tier.name, "native", tokens, text, _first_departure(tokens, native_tokens), run.kld,
                              run.top1, seconds, stored, held))
    return replies


def _llamacpp_replies(opened: dict, peers: list[LlamaCppPeer], prompt, budget: int,
                      geometry: KVGeometry) -> list[_Reply]:
    """Each llama.cpp type's reply from the same prompt ids, against llama.cpp's f16 (peers[0])."""
    ids = torch.cat([prompt.context_ids, prompt.question_ids], dim=1)[0].tolist()
    answered = {peer.name: _llamacpp_reply(opened[peer.name], ids, budget) for peer in peers}
    reference_ids = answered[LLAMACPP_REFERENCE.name][0]
    whole = rule_bytes_per_token(LLAMACPP_REFERENCE, geometry)
    return [_Reply(peer.name, LLAMACPP_REFERENCE.name, tokens, text, _first_departure(tokens, reference_ids), [], [],
                   seconds, rule_bytes_per_token(peer, geometry) / whole, 0)
            for peer, (tokens, text, seconds) in zip(peers, answered.values())]


def _row(problem, index: int, prompt, seed: int, budget: int, reply: _Reply) -> ProblemRow:
    strict, flexible = strict_answer(reply.text), flexible_answer(reply.text)
    kld, top1 = reply.kld, [100.0 * t for t in reply.top1]
    return ProblemRow(
        index, problem.steps, reply.tier, reply.reference, problem.answer, strict, flexible,
        int(is_correct(strict, problem.answer)), int(is_correct(flexible, problem.answer)), len(reply.tokens),
        reply.departure, statistics.fmean(kld) if kld else math.nan, statistics.fmean(top1) if top1 else math.nan,
        _curve(kld), _curve(top1), reply.seconds, reply.stored, reply.held, prompt.tokens, seed, budget, reply.text)


def as_dicts(rows: list[ProblemRow]) -> list[dict]:
    return [asdict(r) for r in rows]
