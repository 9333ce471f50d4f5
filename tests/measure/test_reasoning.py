"""Long generations: word problems generated here, lm-eval's answer extraction, every tier followed along its own
generation against native fed the same tokens, rows resumable, bad input refused before any model work."""

import csv
import math
import re
from dataclasses import asdict

import pytest
import torch

from codeckv.measure.generate import next_logits, stop_token_ids
from codeckv.measure.lockstep import kl_divergence
from codeckv.measure.reasoning import (
    NEVER,
    _follow,
    _Run,
    check_reasoning,
    reasoning_grid,
    reasoning_problem,
    reasoning_tiers,
    steps_of,
)
from codeckv.measure.reasoning_job import ReasoningJob
from codeckv.measure.reasoning_summary import kld_curve, summarize
from codeckv.measure.reasoning_tasks.answers import INVALID, cut_at_stop, flexible_answer, is_correct, strict_answer
from codeckv.measure.reasoning_tasks.prompts import reasoning_prompt
from codeckv.measure.reasoning_tasks.word_problems import MAX_VALUE, word_problem
from codeckv.measure.shared_prefill import shared_prefill
from codeckv.tiers import get_tier

LINE = re.compile(r"(\d+) ([-+x/]) (\d+) = (\d+)")
OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "x": lambda a, b: a * b, "/": lambda a, b: a / b}


@pytest.mark.parametrize("steps", range(2, 9))
def test_a_problem_takes_its_steps_and_its_worked_lines_compute_its_answer(steps):
    for index in range(20):
        problem = word_problem(3, index, steps)
        lines = LINE.findall(problem.solution)
        assert len(lines) == steps == problem.steps
        for a, op, b, result in lines:
            assert OPERATIONS[op](int(a), int(b)) == int(result) and 1 <= int(result) <= MAX_VALUE
        assert int(lines[-1][3]) == problem.answer and problem.solution.endswith(f"#### {problem.answer}")
        assert word_problem(3, index, steps) == problem  # drawn from (seed, index, steps) alone
    assert len({word_problem(3, i, steps).question for i in range(20)}) == 20


@pytest.mark.parametrize("steps", [1, 9, 0, 2.5, True])
def test_a_step_count_outside_two_to_eight_is_refused(steps):
    with pytest.raises(ValueError, match="2..8"):
        word_problem(0, 0, steps)


@pytest.mark.parametrize("reply, strict, flexible", [
    ("She has 12 + 3 = 15.\n#### 15", "15", "15"),
    ("#### 1,234. Then 7", "1,234.", "7"),
    ("so she has $2,050.", INVALID, "$2,050."),
    ("no number here", INVALID, INVALID),
    ("A -3 loss, then 8", INVALID, "8"),
])
def test_answers_are_read_as_lm_evals_gsm8k_filters_read_them(reply, strict, flexible):
    assert strict_answer(reply) == strict and flexible_answer(reply) == flexible


def test_exact_match_normalizes_as_lm_eval_does():
    assert is_correct("1,234.", 1234) and is_correct("$15", 15) and not is_correct("15.5", 15)
    assert not is_correct(INVALID, 15)
    assert cut_at_stop("#### 4\nQuestion: next one #### 9") == "#### 4\n"


def test_the_prompt_splits_into_the_worked_examples_and_the_question(loaded):
    prompt = reasoning_prompt(loaded.tokenizer, word_problem(0, 0, 3))
    context = loaded.tokenizer.decode(prompt.context_ids[0])
    question = loaded.tokenizer.decode(prompt.question_ids[0])
    assert context.count("####") == 5 and "####" not in question  # five worked examples, then the problem
    assert word_problem(0, 0, 3).question in question and question.rstrip().endswith("assistant")
    again = reasoning_prompt(loaded.tokenizer, word_problem(0, 1, 5))
    assert torch.equal(again.context_ids, prompt.context_ids)  # every problem shares the context


@pytest.mark.parametrize("kwargs, message", [
    (dict(samples=-1), "samples"), (dict(samples=0), "samples"), (dict(budget=9000), "budget"),
    (dict(budget=4), "budget"), (dict(steps=(9,)), "steps"), (dict(steps=()), "step count"),
])
def test_a_grid_out_of_bounds_is_refused_before_any_model_work(kwargs, message):
    arguments = dict(samples=2, steps=(3,), budget=256, max_context=8192) | kwargs
    with pytest.raises(ValueError, match=message):
        check_reasoning(**arguments)


def test_problems_take_the_step_counts_in_turn():
    assert [steps_of(i, (2, 5)) for i in range(4)] == [2, 5, 2, 5]


BUDGET = 24


@pytest.fixture(scope="module")
def grid(loaded):
    rows = reasoning_grid(loaded, [get_tier("png"), get_tier("turbo-3"), get_tier("snapkv-50")], samples=2,
                          steps=(2,), budget=BUDGET)
    return rows, None


def test_one_row_per_problem_and_tier(grid):
    rows, _ = grid
    assert [(r.index, r.tier) for r in rows] == [(i, t) for i in (0, 1) for t in ("png", "turbo-3", "snapkv-50",
                                                                                   "native")]
    for row in rows:
        assert row.reference == "native" and row.budget == BUDGET and 1 <= row.answer_tokens <= BUDGET
        assert len(row.kld_curve.split(";")) == math.ceil((row.answer_tokens + (row.answer_tokens < BUDGET)) / 32)
        assert row.correct in (0, 1) and row.seconds > 0


def test_native_is_its_own_reference_and_a_lossless_tier_never_departs(loaded, grid):
    rows, _ = grid
    for row in rows:
        if row.tier in ("native", "png"):
            assert row.first_departure == NEVER and row.kld == 0.0 and row.top1 == 100.0, row
    assert any(r.first_departure != NEVER for r in rows if r.tier in ("turbo-3", "snapkv-50"))
    context = reasoning_prompt(loaded.tokenizer, word_problem(0, 0, 2)).context_ids.shape[1]
    for row in rows:  # at the end of the reply: half the worked examples, the question and the reply, of all seen
        if row.tier == "snapkv-50":
            seen = row.prompt_tokens + row.answer_tokens
            evicted = context - context // 2
            assert row.stored_vs_bf16 == pytest.approx((seen - evicted) / seen, abs=0.01)


def test_the_kld_along_a_tiers_own_path_is_native_fed_the_same_tokens(loaded):
    """Recomputed apart, token by token: the tier's cache fed its own reply, a native cache fed the same reply; the
    KLD and top-1 at each position are the grid's, within the rounding of another batch shape."""
    problem = word_problem(0, 0, 2)
    prompt = reasoning_prompt(loaded.tokenizer, problem)
    prefill = shared_prefill(loaded, prompt.context_ids, capture_queries=False)
    tier = _Run(get_tier("turbo-3"), prefill.cache_for(get_tier("turbo-3")))
    native = _Run(get_tier("native"), prefill.cache_for(get_tier("native")))
    _follow(loaded, [tier, native], native, prompt.question_ids, 40, stop_token_ids(loaded.tokenizer, loaded.model))
    departure = next(i for i, (a, b) in enumerate(zip(tier.tokens, native.tokens)) if a != b)
    assert departure < len(tier.tokens) - 4, "turbo-3 should leave SmolLM2's path within 40 tokens here"
    tier_cache, native_cache = prefill.cache_for(get_tier("turbo-3")), prefill.cache_for(get_tier("native"))
    feed = prompt.question_ids
    for position, token in enumerate(tier.tokens):
        mine = torch.log_softmax(next_logits(loaded.model, feed, tier_cache)[0], -1)
        theirs = torch.log_softmax(next_logits(loaded.model, feed, native_cache)[0], -1)
        assert int(mine.argmax()) == token or _near_tie(mine), "the tier's own greedy path, again"
        assert float(kl_divergence(theirs, mine)) == pytest.approx(tier.kld[position], rel=0.02, abs=1e-4)
        assert (theirs.argmax() == mine.argmax()) == tier.top1[position] or _near_tie(mine) or _near_tie(theirs)
        feed = torch.tensor([[token]])


def _near_tie(logprobs: torch.Tensor) -> bool:
    """The two likeliest tokens within the rounding another batch shape gives (the argmax may swap there)."""
    top = logprobs.topk(2).values
    return float(top[0] - top[1]) < 1e-4


def test_rows_already_measured_are_skipped_and_the_rest_are_the_same(loaded, grid):
    rows, _ = grid
    job = ReasoningJob("smollm2-135m", ["png", "turbo-3", "snapkv-50"], samples=2, steps=(2,), budget=BUDGET)
    kept = [{k: str(v) for k, v in asdict(r).items()} for r in rows if r.tier != "turbo-3"]
    cells = job.cells(kept)
    assert cells == [{"index": 0, "tiers": ["turbo-3"]}, {"index": 1, "tiers": ["turbo-3"]}]
    torch_tiers, llama = reasoning_tiers(loaded, [get_tier("png"), get_tier("turbo-3"), get_tier("snapkv-50")])
    again = [row for cell in cells for row in reasoning_problem(loaded, torch_tiers, llama, {}, cell["index"],
                                                                steps=(2,), budget=BUDGET, todo=set(cell["tiers"]))]
    assert [(r.index, r.tier) for r in again] == [(0, "turbo-3"), (1, "turbo-3")]
    for new, old in zip(again, [r for r in rows if r.tier == "turbo-3"]):
        assert (new.text, new.first_departure) == (old.text, old.first_departure)


def test_the_summary_counts_agreement_flips_and_departures_against_the_reference(grid):
    from dataclasses import asdict

    rows = [asdict(r) for r in grid[0]]
    summary = {s["tier"]: s for s in summarize(rows)}
    native = summary["native"]
    assert native["agreement"] == 100.0 and native["lost"] == native["gained"] == 0 and native["departed"] == 0.0
    assert summary["png"]["agreement"] == 100.0 and summary["png"]["problems"] == 2
    for tier in ("turbo-3", "snapkv-50"):
        mine = [r for r in rows if r["tier"] == tier]
        assert summary[tier]["lost"] == sum(n["correct"] and not m["correct"] for m, n in
                                            zip(mine, [r for r in rows if r["tier"] == "native"]))
        assert summary[tier]["kld"] == pytest.approx(sum(r["kld"] for r in mine) / 2)
    curve = kld_curve(rows)
    assert {c["tier"] for c in curve} == set(summary) and all(c["from"] == 0 for c in curve)


def test_the_cli_writes_problem_rows_as_cells_and_update_grows_the_problems(tmp_path, capsys):
    from codeckv.cli import main

    out = tmp_path / "reasoning.csv"
    small = ["reasoning", "--steps", "2", "--budget", "16", "--tiers", "turbo-3", "--out", str(out), "--charts",
             str(tmp_path / "charts")]
    assert main([*small, "--samples", "1"]) == 0
    problems = out.with_name("reasoning-problems.csv")
    first = [(r["index"], r["tier"], r["text"]) for r in csv.DictReader(problems.open())]
    assert [row[:2] for row in first] == [("0", "turbo-3"), ("0", "native")]
    assert main([*small, "--samples", "2", "--update"]) == 0
    rows = list(csv.DictReader(problems.open()))
    assert [(r["index"], r["tier"], r["text"]) for r in rows][:2] == first, "kept as they were"
    assert [(r["index"], r["tier"]) for r in rows][2:] == [("1", "turbo-3"), ("1", "native")]
    assert rows[0]["node"] and rows[0]["node_kind"]
    assert {r["tier"] for r in csv.DictReader(out.open())} == {"turbo-3", "native"}
    assert main([*small, "--samples", "2", "--update", "--seed", "3"]) == 1
    assert "measured with seed 0, not 3" in capsys.readouterr().err
