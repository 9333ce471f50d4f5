"""Each press scores a prefill's tokens per KV head as kvpress 0.5.5 does; keep_indices keeps the top share (rounded
down, as kvpress's compute_n_kept). tests/presses/test_kvpress_reference.py checks them against kvpress on a model."""

import math

import pytest
import torch

from codeckv.presses import (
    PRESSES,
    ExpectedAttentionPress,
    KnormPress,
    SnapKVPress,
    StreamingLLMPress,
    TOVAPress,
    keep_indices,
    kept_count,
)


def _chunk(b=1, h=2, g=3, s=40, d=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    keys, values = torch.randn(b, h, s, d, generator=gen), torch.randn(b, h, s, d, generator=gen)
    return keys, values, torch.randn(b, h * g, s, d, generator=gen)


@pytest.mark.parametrize("name", PRESSES)
@pytest.mark.parametrize("ratio", [0.0, 0.25, 0.5, 0.75, 0.875, 0.9])
def test_every_press_keeps_the_same_share_in_every_head_in_order(name, ratio):
    keys, values, queries = _chunk(s=70)
    keep = keep_indices(PRESSES[name](ratio), keys, values, queries)
    assert keep.shape == (1, 2, kept_count(70, ratio)) == (1, 2, math.floor(70 * (1 - ratio)))
    assert torch.all(keep[..., 1:] > keep[..., :-1]), "positions in order, none twice"


def test_streamingllm_keeps_the_sinks_and_the_newest():
    keys, values, queries = _chunk(s=20)
    keep = keep_indices(StreamingLLMPress(0.5, sinks=4), keys, values, queries)
    assert keep[0, 0].tolist() == [0, 1, 2, 3, 14, 15, 16, 17, 18, 19]


def test_knorm_keeps_the_smallest_keys():
    keys, values, queries = _chunk(s=10)
    keys[0, 1, 7] *= 100  # the largest key of head 1
    keep = keep_indices(KnormPress(0.1), keys, values, queries)
    assert 7 not in keep[0, 1].tolist() and keep.shape[-1] == 9


def test_snapkv_keeps_its_observation_window_and_expected_attention_its_sinks():
    keys, values, queries = _chunk(s=32)
    keep = keep_indices(SnapKVPress(0.75, window=6), keys, values, queries)  # 8 kept: the 6 of the window, 2 more
    assert set(range(26, 32)) <= set(keep[0, 0].tolist())
    keys[:, :, :4] *= 50  # sinks that no query would pick
    keep = keep_indices(ExpectedAttentionPress(0.875), keys, values, queries)  # 4 kept: the sinks
    assert keep[0].tolist() == [[0, 1, 2, 3]] * 2


def test_tova_keeps_one_set_for_every_kv_head():
    """kvpress's TOVA averages the last query's attention over all query heads: every KV head keeps the same."""
    keys, values, queries = _chunk(h=3, g=2, s=50)
    keep = keep_indices(TOVAPress(0.5), keys, values, queries)
    assert torch.equal(keep[0, 0], keep[0, 1]) and torch.equal(keep[0, 0], keep[0, 2]) and 49 in keep[0, 0]


def test_snapkv_pools_each_query_head_then_averages_its_group():
    """kvpress's order: average-pool per query head, then the mean over the group (pooling is linear: the same as
    pooling the mean), and the window's own columns are left out of the pooling, so they cannot lift a neighbour."""
    keys, values, queries = _chunk(h=1, g=1, s=24, d=8)
    press = SnapKVPress(0.5, window=4, kernel=5)
    scores = press.scores(keys, values, queries)
    from codeckv.presses.base import window_attention
    attention = window_attention(keys, queries, 4)[..., :20]
    pooled = torch.nn.functional.avg_pool1d(attention, 5, stride=1, padding=2)  # zero-padded at both ends
    torch.testing.assert_close(scores[..., :20], pooled, msg="SnapKV's scores are its window's pooled attention")
    assert torch.all(scores[..., 20:] == scores[..., :20].max() + 1), "the window is kept above everything"


def test_expected_attention_turns_the_queries_back_before_rope():
    """With a RoPE at every position, the statistics come from the queries before it: rotating the queries by the
    Rope given changes nothing, and a Rope that does not rotate equals none."""
    from codeckv.presses import Rope
    from codeckv.presses.expected_attention import _before_rope

    keys, values, queries = _chunk(h=1, g=2, s=30, d=8)
    inv = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))

    def at(positions):
        angles = positions.float()[:, None] * inv[None]
        emb = torch.cat([angles, angles], dim=-1)
        return emb.cos(), emb.sin()

    cos, sin = at(torch.arange(30))
    half = torch.cat((-queries[..., 4:], queries[..., :4]), dim=-1)
    rotated = queries * cos + half * sin
    torch.testing.assert_close(_before_rope(rotated, cos, sin), queries, msg="the rotation undone")
    press = ExpectedAttentionPress(0.5)
    still = Rope(lambda p: (torch.ones(len(p), 8), torch.zeros(len(p), 8)), 30)
    torch.testing.assert_close(press.scores(keys, values, queries, still), press.scores(keys, values, queries),
                               msg="a rotation by zero is no rotation")
    assert keep_indices(press, keys, values, rotated, rope=Rope(at, 30)).shape == (1, 1, 15)


def test_attention_based_presses_follow_the_queries():
    """A key that the last queries point at is kept by SnapKV and TOVA; with other queries it is not."""
    keys, values, queries = _chunk(h=1, g=1, s=32, d=8)
    keys[0, 0, 5] = 0.0
    keys[0, 0, 5, 0] = 30.0
    aimed = queries.clone()
    aimed[..., 0] = 10.0  # every query points at key 5's direction
    away = queries.clone()
    away[..., 0] = -10.0
    for press in (SnapKVPress(0.8, window=4, kernel=1), TOVAPress(0.8)):  # 6 of 32 kept
        assert 5 in keep_indices(press, keys, values, aimed)[0, 0].tolist(), type(press).__name__
        assert 5 not in keep_indices(press, keys, values, away)[0, 0].tolist(), type(press).__name__


@pytest.mark.parametrize("make, message", [
    (lambda: SnapKVPress(1.0), r"ratio=1.0 must be a share evicted in \[0, 1\)"),
    (lambda: TOVAPress(-0.1), "ratio=-0.1"),
    (lambda: SnapKVPress(0.5, kernel=4), "kernel=4 must be odd"),
    (lambda: StreamingLLMPress(0.5, sinks=-1), "sinks=-1"),
    (lambda: ExpectedAttentionPress(0.5, sinks=-1), "sinks=-1"),
    (lambda: ExpectedAttentionPress(0.5, future=0), "future=0"),
])
def test_impossible_settings_say_what_is_allowed(make, message):
    with pytest.raises(ValueError, match=message):
        make()
