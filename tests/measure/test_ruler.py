"""The long-context grid: one native prefill per sample serving every tier, rows RULER's way, resumable."""

import math
from dataclasses import asdict

import pytest
import torch

from codeckv.cache.stacked import StackedCache
from codeckv.measure.generate import next_logits
from codeckv.measure.long_tasks import long_sample
from codeckv.measure.ruler import (
    _Answer,
    _decode_together,
    _first_token,
    grid_tiers,
    ruler_grid,
    ruler_sample,
    summarize,
)
from codeckv.measure.ruler_job import RulerJob
from codeckv.measure.shared_prefill import shared_prefill
from codeckv.tiers import get_tier


@pytest.fixture(scope="module")
def grid(loaded):
    return ruler_grid(loaded, [get_tier("turbo-4"), get_tier("snapkv-50")], ["niah_single_1"], [512], samples=2)


def test_one_row_per_task_length_and_tier_with_rulers_score(grid):
    rows = grid
    assert [r.tier for r in rows] == ["turbo-4", "snapkv-50", "native"]
    for row in rows:
        assert row.task == "niah_single_1" and row.length == 512 and row.samples == 2
        assert 0.0 <= row.score <= 100.0 and row.score_se >= 0.0
        assert row.seconds > 0 and row.prompt_tokens <= 512 - 128
    native = {r.tier: r for r in rows}["native"]
    assert native.score == 100.0, "SmolLM2 finds a number in 300 tokens of noise: the task or its framing is broken"
    assert native.stored_vs_bf16 == 1.0 and native.press_mode == ""
    press = {r.tier: r for r in rows}["snapkv-50"]
    assert press.press_mode == "once" and press.stored_vs_bf16 == pytest.approx(0.5, abs=0.01)
    assert {r.tier: r for r in rows}["turbo-4"].stored_vs_bf16 < 0.35


def test_the_native_row_carries_the_shared_prefill(grid):
    rows = grid
    by_tier = {r.tier: r for r in rows}
    prefill = by_tier["turbo-4"].seconds / by_tier["turbo-4"].prefill_share
    native = by_tier["native"]
    assert native.seconds == pytest.approx(prefill + native.prefill_share * prefill)


def test_a_resumed_grid_runs_only_the_samples_and_tiers_its_csv_lacks():
    job = RulerJob("smollm2-135m", ["turbo-4", "snapkv-50"], ["niah_single_1"], [512], samples=3)
    kept = [{"task": "niah_single_1", "length": "512", "sample": str(index), "tier": tier}
            for index in (0, 1) for tier in ("turbo-4", "native")] + [
           {"task": "niah_single_1", "length": "512", "sample": "0", "tier": "snapkv-50"}]
    assert job.cells(kept) == [{"task": "niah_single_1", "length": 512, "sample": 1, "tiers": ["snapkv-50"]},
                               {"task": "niah_single_1", "length": 512, "sample": 2,
                                "tiers": ["turbo-4", "snapkv-50", "native"]}]


def test_a_tier_measured_alone_scores_as_in_the_whole_grid(loaded, grid):
    """The same sample (deterministic for the seed and index), the tier without the others beside it."""
    [press] = grid_tiers(loaded, [get_tier("snapkv-50")], "once")[:1]
    scores = [ruler_sample(loaded, [press], "niah_single_1", 512, index)[0].score for index in (0, 1)]
    assert sum(scores) / 2 == {r.tier: r for r in grid}["snapkv-50"].score


def test_without_a_shared_prefill_no_share_is_given(loaded):
    """Native's row not asked for and the one tier prefilling the context itself (a press in chunked mode, as
    llama.cpp's types do): no prefill is shared, so the row's share of it is not a number (not its seconds over
    the microseconds of no prefill)."""
    [press] = grid_tiers(loaded, [get_tier("snapkv-50")], "chunked")[:1]
    rows = [asdict(ruler_sample(loaded, [press], "niah_single_1", 512, 0, press_mode="chunked")[0])]
    [alone] = summarize(rows)
    assert alone.tier == "snapkv-50" and alone.press_mode == "chunked" and rows[0]["prefill_seconds"] == 0.0
    assert alone.seconds > 0 and math.isnan(alone.prefill_share)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lengths": [10**6]}, "outside 256.."),
    ({"tasks": ["qa_1"]}, "unknown task"),
    ({"samples": 0}, "samples=0"),
    ({"press_mode": "sometimes"}, "not a press protocol"),
    ({"haystack": "/nonexistent/file.txt"}, "neither an embedded text"),
])
def test_a_grid_out_of_bounds_is_refused_before_any_prefill(loaded, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ruler_grid(loaded, [get_tier("turbo-4")], **{"tasks": ["niah_single_1"], "lengths": [512], **kwargs})


def _started(loaded, sample):
    """turbo-4, snapkv-50 (half the context evicted) and native holding one sample's context and question, with the
    first token of each one's answer."""
    prefill = shared_prefill(loaded, sample.context_ids)
    caches = [prefill.cache_for(get_tier(name)) for name in ("turbo-4", "snapkv-50")] + [prefill.native]
    return caches, [_first_token(loaded, cache, sample.question_ids) for cache in caches]


def test_tiers_decoding_together_get_the_log_probs_each_gets_alone(loaded):
    """One batch row per tier: each attends to its own cache (a press's holds half the tokens, at the same
    positions), so only the matrix products' rounding at another batch size may differ."""
    sample = long_sample("niah_single_1", loaded.tokenizer, 512)
    together, firsts = _started(loaded, sample)
    alone, firsts_alone = _started(loaded, sample)
    assert firsts == firsts_alone
    ids = torch.tensor([[token] for token in firsts])
    stacked = next_logits(loaded.model, ids, StackedCache(together, rows=1)).log_softmax(-1)
    for index, cache in enumerate(alone):
        own = next_logits(loaded.model, ids[index : index + 1], cache).log_softmax(-1)[0]
        assert torch.allclose(stacked[index], own, atol=1e-3, rtol=1e-4), index
        top2 = own.topk(2).values
        if top2[0] - top2[1] > 1e-3:  # the greedy token agrees unless the two best are within the rounding
            assert stacked[index].argmax() == own.argmax()


def test_a_tier_leaves_the_batch_when_its_answer_ends(loaded):
    sample = long_sample("niah_single_1", loaded.tokenizer, 512)
    caches, firsts = _started(loaded, sample)
    budget = 6
    answers = [_Answer(str(index), cache, [token]) for index, (cache, token) in enumerate(zip(caches, firsts))]
    answers[0].tokens = [firsts[0]] * budget  # already at its budget: never in a step
    _decode_together(loaded, answers, budget, stop_ids=frozenset(), outputs=["a string no answer holds"])
    assert answers[0].tokens == [firsts[0]] * budget and answers[0].seconds == 0.0
    for answer in answers[1:]:
        assert len(answer.tokens) == budget and answer.seconds > 0.0


def test_progress_names_each_stage_of_a_sample(loaded):
    """A long sample says where it is (the prefill, each tier, the answers decoding), and each report is a place a
    stop or the app's deadline can interrupt."""
    seen = []
    ruler_grid(loaded, [get_tier("turbo-4")], ["niah_single_1"], [512], samples=1,
               progress=lambda done, total, message: seen.append((done, total, message)))
    messages = [message for _, _, message in seen]
    assert any("prefilling" in m for m in messages) and any(m.endswith(": turbo-4") for m in messages)
    assert any(m.endswith(": 2 answers decoding together") for m in messages)
    assert seen[-1][:2] == (1, 1) and all(done == 0 for done, _, _ in seen[:-1])
