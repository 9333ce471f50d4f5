"""StackedCache: each member cache holds exactly what it would hold alone; bad stacks are refused clearly."""

import time

import pytest
import torch
from transformers import DynamicCache

from codeckv.cache import make_cache
from codeckv.cache.attention import use_codec_attention
from codeckv.cache.stacked import StackedCache


@torch.inference_mode()
def test_each_member_holds_and_predicts_what_it_would_alone(tiny_gemma3):
    """Within the rounding of another batch size: at most 3.7e-6 in keys and 6.5e-7 in logits on six emulated CPUs
    (scripts/float_noise.py, "stack members"; assets/float-noise.csv), bounded by 4e-5 and 1e-5."""
    use_codec_attention(tiny_gemma3)
    ids = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(3))
    names = ("native", "turbo-4")
    alone = [make_cache(tiny_gemma3.config, name, materialization_free=False) for name in names]  # views: compared
    want_logits = []
    for cache in alone:
        tiny_gemma3(input_ids=ids[:, :32], cache=cache, use_cache=True)  # a prefill, then 8 decode steps
        want_logits.append(torch.cat([tiny_gemma3(input_ids=ids[:, t : t + 1], cache=cache).logits
                                      for t in range(32, 40)], dim=1))
    members = [make_cache(tiny_gemma3.config, name, materialization_free=False) for name in names]
    stacked = StackedCache(members, rows=2)
    batch = ids.repeat(2, 1)
    tiny_gemma3(input_ids=batch[:, :32], cache=stacked, use_cache=True)
    logits = torch.cat([tiny_gemma3(input_ids=batch[:, t : t + 1], cache=stacked).logits for t in range(32, 40)], 1)
    assert stacked.get_seq_length() == 40 and logits.shape[:2] == (4, 8)
    for index, (member, single) in enumerate(zip(members, alone)):
        for got, want in zip(member.layers, single.layers):
            assert torch.allclose(got.keys, want.keys, atol=4e-5), (names[index], type(got).__name__)
        assert torch.allclose(logits[2 * index : 2 * index + 2], want_logits[index], atol=1e-5), names[index]
    assert (logits[:2] - logits[2:]).abs().max() > 1e-4, "turbo-4's rows see its own (lossy) cache"


@torch.inference_mode()
def test_bad_stacks_are_refused(tiny_gemma3):
    use_codec_attention(tiny_gemma3)
    with pytest.raises(ValueError, match="at least one cache"):
        StackedCache([], rows=2)
    with pytest.raises(ValueError, match="same, known number of layers"):
        StackedCache([DynamicCache(), make_cache(tiny_gemma3.config, "png")], rows=1)
    stacked = StackedCache([make_cache(tiny_gemma3.config, "png")] * 2, rows=2)
    with pytest.raises(ValueError, match="takes a batch of 4 rows, got 3"):
        tiny_gemma3(input_ids=torch.zeros((3, 4), dtype=torch.long), cache=stacked, use_cache=True)


@torch.inference_mode()
def test_each_member_is_timed_for_its_own_cache_work(tiny_gemma3):
    """A member whose updates take longer is charged that time, the others not: member_seconds holds each member's
    updates and attention alone (what measure/ruler.py charges a tier beside its share of the step)."""
    use_codec_attention(tiny_gemma3)
    members = [make_cache(tiny_gemma3.config, "native"), make_cache(tiny_gemma3.config, "turbo-4")]
    slow = members[1].layers[0]
    plain_update = slow.update

    def slow_update(*args, **kwargs):
        time.sleep(0.2)
        return plain_update(*args, **kwargs)

    slow.update = slow_update
    stacked = StackedCache(members, rows=1)
    tiny_gemma3(input_ids=torch.zeros((2, 8), dtype=torch.long), cache=stacked, use_cache=True)
    native_seconds, slow_seconds = stacked.member_seconds
    assert slow_seconds >= 0.2 and 0.0 < native_seconds < slow_seconds - 0.15
