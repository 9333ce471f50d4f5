"""Each press scores a chunk's tokens per KV head as its paper and kvpress do; keep_indices keeps the top share."""

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
@pytest.mark.parametrize("ratio", [0.0, 0.5, 0.75])
def test_every_press_keeps_the_same_share_in_every_head_in_order(name, ratio):
    keys, values, queries = _chunk()
    keep = keep_indices(PRESSES[name](ratio), keys, values, queries)
    assert keep.shape == (1, 2, kept_count(40, ratio)) == (1, 2, math.ceil(40 * (1 - ratio)))
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


def test_snapkv_and_expected_attention_keep_their_observation_window():
    keys, values, queries = _chunk(s=30)
    for press in (SnapKVPress(0.75, window=6), ExpectedAttentionPress(0.75, window=6)):
        keep = keep_indices(press, keys, values, queries)  # 8 kept: the 6 of the window, 2 more
        assert set(range(24, 30)) <= set(keep[0, 0].tolist()), type(press).__name__


def test_attention_based_presses_follow_the_queries():
    """A key that the last queries point at is kept by SnapKV and TOVA; with other queries it is not."""
    keys, values, queries = _chunk(h=1, g=1, s=32, d=8)
    keys[0, 0, 5] = 0.0
    keys[0, 0, 5, 0] = 30.0
    aimed = queries.clone()
    aimed[..., 0] = 10.0  # every query points at key 5's direction
    away = queries.clone()
    away[..., 0] = -10.0
    for press in (SnapKVPress(0.8, window=4, kernel=1), TOVAPress(0.8)):  # 7 of 32 kept
        assert 5 in keep_indices(press, keys, values, aimed)[0, 0].tolist(), type(press).__name__
        assert 5 not in keep_indices(press, keys, values, away)[0, 0].tolist(), type(press).__name__


@pytest.mark.parametrize("make, message", [
    (lambda: SnapKVPress(1.0), r"ratio=1.0 must be a share evicted in \[0, 1\)"),
    (lambda: TOVAPress(-0.1), "ratio=-0.1"),
    (lambda: SnapKVPress(0.5, kernel=4), "kernel=4 must be odd"),
    (lambda: StreamingLLMPress(0.5, sinks=-1), "sinks=-1"),
    (lambda: ExpectedAttentionPress(0.5, window=1), "window=1"),
])
def test_impossible_settings_say_what_is_allowed(make, message):
    with pytest.raises(ValueError, match=message):
        make()
