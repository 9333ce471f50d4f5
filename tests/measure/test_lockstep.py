"""Distribution metrics on a tiny model: png is exactly native (KLD 0, top-1 100%), a lossy tier is not; caches
fed together in one stacked batch score as they do alone; the spread over windows is the standard error."""

import dataclasses
import math

import pytest
import torch

from codeckv.cache import CODES, VIEW, make_cache
from codeckv.cache.attention import use_codec_attention
from codeckv.loaded import ModelInfo
from codeckv.measure.lockstep import compare, kl_divergence, lockstep, spread, stack_size


@pytest.fixture
def windows():
    return torch.randint(0, 128, (3, 48), generator=torch.Generator().manual_seed(1))


def _caches(model, *names, on_codes=False):
    return [make_cache(model.config, name, materialization_free=on_codes) for name in names]


def test_png_is_exactly_native_and_a_lossy_tier_is_not(tiny_gemma3, windows):
    reference, (native, png, lossy) = lockstep(tiny_gemma3, windows, _caches(tiny_gemma3, "native", "png", "jpeg-k2"))
    assert reference.logprobs.shape == (3, 23, 128) and reference.prefix == 24
    assert compare(reference, native).kld.mean == 0.0
    png = compare(reference, png)
    assert png.kld.mean == 0.0 and png.top1_pct.mean == 100.0 and png.delta_nll_pct.mean == 0.0
    assert png.nll == png.nll_native
    lossy = compare(reference, lossy)
    assert lossy.kld.mean > 0 and lossy.kld.se > 0


@pytest.fixture
def two_threads():
    """CPU attention splits its work by batch with 2 threads: the case a shared attention call would change."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("on_codes", [False, True], ids=["view", "codes"])
def test_a_stacked_batch_scores_each_cache_as_it_scores_alone(tiny_gemma3, windows, two_threads, on_codes):
    """Attention runs per cache (on a decoded view or on the codes), so a cache's place in the batch changes
    nothing (bitwise, on six emulated CPUs), and scoring it alone changes only the matrix products' rounding at
    another batch size: at most 1.3e-5 of an NLL and 5.3e-7 of a KLD there (scripts/float_noise.py, "stack" and
    "order"; assets/float-noise.csv), bounded here by 1e-4 and 5e-6."""
    names = ["turbo-4", "jpeg-k2", "int8"]
    use_codec_attention(tiny_gemma3)  # before the caches are made: on a routed model make_cache can read the codes
    caches = lambda *tiers: _caches(tiny_gemma3, *tiers, on_codes=on_codes)  # noqa: E731
    first = caches("native", *names)
    assert {mode for cache in first[1:] for mode in cache.attention.values()} == {CODES if on_codes else VIEW}
    reference, together = lockstep(tiny_gemma3, windows, first)
    _, reversed_order = lockstep(tiny_gemma3, windows, caches("native", *names[::-1]))
    for name, stacked, other_place in zip(names, together[1:], reversed_order[:0:-1]):
        for field in ("nll", "kld", "top1"):
            assert torch.equal(getattr(stacked, field), getattr(other_place, field)), (name, field)
        _, (alone,) = lockstep(tiny_gemma3, windows, caches(name), reference=reference)
        assert torch.allclose(stacked.nll, alone.nll, atol=1e-4, rtol=0), name
        assert torch.allclose(stacked.kld, alone.kld, atol=5e-6, rtol=0), name


def test_stack_size_bounds_the_kv_of_a_batch():
    info = ModelInfo("tiny", "test", ["full_attention"] * 6, num_kv_heads=1, head_dim=64, dtype="float32",
                     device="cpu", max_context=256, load_seconds=0.0)  # 3 KiB of K+V per token, 6 KiB counted
    assert stack_size(info, 2, 512, budget=6 * 1024 * 1024 * 3) == 3
    assert stack_size(dataclasses.replace(info, dtype="bfloat16"), 2, 512, budget=6 * 1024 * 1024 * 3) == 6
    assert stack_size(info, 8, 4096, budget=1) == 1


def test_kl_divergence_matches_its_definition():
    p = torch.log(torch.tensor([[0.5, 0.5, 0.0]]))
    q = torch.log(torch.tensor([[0.25, 0.75, 0.0]]))
    want = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert kl_divergence(p, q).item() == pytest.approx(want)
    assert kl_divergence(q, q).item() == 0.0


def test_spread_is_the_standard_error_over_windows():
    s = spread(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert s.mean == 2.5 and s.se == pytest.approx(torch.tensor([1.0, 2, 3, 4]).std().item() / 2)
    assert math.isnan(spread(torch.tensor([1.0])).se)


def test_a_press_is_scored_after_the_prefill_it_compressed(loaded):
    """The quality protocol for a press (as kvpress's benchmark): the prefill is pressed, the scored tokens are not."""
    windows = loaded.tokenizer("The quick brown fox jumps over the lazy dog. " * 20, return_tensors="pt").input_ids
    windows = windows[:, :96].repeat(2, 1)
    caches = [make_cache(loaded, name) for name in ("native", "streamingllm-50", "snapkv-50+turbo-4")]
    reference, scores = lockstep(loaded.model, windows, caches)
    for cache, score in zip(caches[1:], scores[1:]):
        layer = cache.layers[0]
        assert layer.evicted == 24 and cache.get_seq_length() == 95, "half the 48 prefilled tokens are gone"
        stats = compare(reference, score)
        assert 0 < stats.kld.mean < math.inf and 0 <= stats.top1_pct.mean <= 100
