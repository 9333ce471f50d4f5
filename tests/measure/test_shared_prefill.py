"""One native prefill serves every tier: a press pressed from the captured queries keeps what pressing in its own
one-forward prefill keeps, a codec converted holds what prefilling through it holds, and native is left as it was."""

import pytest
import torch

from codeckv.cache import make_cache
from codeckv.corpus import corpus_windows
from codeckv.measure.shared_prefill import shared_prefill
from codeckv.tiers import get_tier


@pytest.fixture(scope="module")
def context(loaded):
    return corpus_windows(loaded.tokenizer, 1, 300)


@pytest.fixture(scope="module")
def prefill(loaded, context):
    return shared_prefill(loaded, context)


@pytest.mark.parametrize("name", ["snapkv-75", "expected-50", "tova-875", "streamingllm-25",
                                  "snapkv-50+turbo-4"])
def test_a_press_from_the_shared_prefill_keeps_what_its_own_prefill_keeps(loaded, context, prefill, name):
    own = make_cache(loaded, name, press_mode="once")
    with torch.inference_mode():
        loaded.model(input_ids=context, cache=own)
    shared = prefill.cache_for(get_tier(name))
    for index, (a, b) in enumerate(zip(own.layers, shared.layers, strict=True)):
        assert torch.equal(a.positions(), b.positions()), f"layer {index}: other positions kept"
    token = torch.tensor([[42]])
    with torch.inference_mode():
        want = loaded.model(input_ids=token, cache=own).logits
        got = loaded.model(input_ids=token, cache=shared).logits
    torch.testing.assert_close(got, want, atol=2e-3, rtol=0, msg="the next step reads the same cache")


def test_a_question_after_the_context_is_not_pressed_once_and_is_chunked(loaded, context):
    """'once' presses the first forward only; 'chunked' presses every prefill chunk."""
    once, chunked = make_cache(loaded, "knorm-50"), make_cache(loaded, "knorm-50", press_mode="chunked")
    with torch.inference_mode():
        for cache in (once, chunked):
            loaded.model(input_ids=context[:, :200], cache=cache)
            loaded.model(input_ids=context[:, 200:300], cache=cache)  # the question
    assert once.press_mode == "once" and once.layers[0].held == 100 + 100
    assert chunked.press_mode == "chunked" and chunked.layers[0].held == 100 + 50
    with pytest.raises(ValueError, match="allowed: once, chunked"):
        make_cache(loaded, "knorm-50", press_mode="sometimes")


def test_native_is_left_as_it_was_and_codecs_convert(loaded, prefill):
    before = prefill.native.layers[0].keys.clone()
    turbo = prefill.cache_for(get_tier("turbo-4"))
    copy = prefill.cache_for(get_tier("native"))
    assert turbo.get_seq_length() == copy.get_seq_length() == 300
    assert torch.equal(prefill.native.layers[0].keys, before)
    assert set(prefill.queries) == set(range(len(loaded.info.layer_types)))


def test_quality_from_one_prefill_scores_as_lockstep(loaded):
    """measure/shared_quality.py against measure_quality on the same windows: a press alone (its scored tokens in one
    forward) and a codec (one at a time) move the model as much, up to the rounding of another batch shape and code
    path (here: snapkv-50 equal to 4 digits, snapkv-50+turbo-4 0.04909 against 0.04913, 8e-4 relative; a lossy
    codec's rounding flips on another CPU can move it more, so the bound is 1%, far below any change of method)."""
    from codeckv.measure.quality import measure_quality
    from codeckv.measure.shared_quality import shared_quality

    tiers = ["snapkv-75", "turbo-4"]
    lockstep = {r.tier: r for r in measure_quality(loaded, [get_tier(t) for t in tiers], windows=2, length=160,
                                                   prefix=128).rows}
    shared = {r.tier: r for r in shared_quality(loaded, [get_tier(t) for t in tiers], windows=2, length=160,
                                                prefix=128).rows}
    assert list(shared) == ["native", *tiers] and shared["native"].kld == 0.0
    for name in tiers:
        a, b = lockstep[name], shared[name]
        assert b.kld == pytest.approx(a.kld, rel=1e-2, abs=1e-6), name
        assert b.stored_vs_bf16 == pytest.approx(a.stored_vs_bf16) and b.windows == 2 and b.prefix_tokens == 128
