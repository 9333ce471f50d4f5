"""The PCA tiers' rate control (codecs/rate.py): on texts far from the calibration text each layer stays within
its share of the tier's budget and all layers together within the budget at every chunk boundary, the step
adapts to the text, and what is stored decodes."""

from __future__ import annotations

import pytest
import torch

import codeckv.cache.calibration as calibration
from codeckv.cache import make_cache
from codeckv.cache.pca_layer import PCALayer
from codeckv.codecs.ans import LENGTH_BYTES
from codeckv.codecs.pca import JointPCA
from codeckv.codecs.rate import HEADER_BYTES, LADDER, REPAY_TOKENS, SKIP, RateBudget, Spent
from codeckv.corpus import text_windows
from codeckv.measure.pca_size import SIZE_TEXTS
from codeckv.tiers import Tier

SPEC = JointPCA(bits_per_element=1.0, calibration_windows=2, calibration_length=64)  # a fast calibration
TIER = Tier("pca-rate", "rate control under test", joint=SPEC)
TEXTS = ["code", "numbers", "multilingual", "repeated"]


@pytest.fixture(scope="module")
def small_calibration(loaded):
    ids = calibration.calibration_windows(loaded.tokenizer, SPEC.calibration_windows, SPEC.calibration_length)
    return calibration.calibrate(loaded.model, ids, SPEC, "smollm2-135m")


@pytest.fixture(scope="module")
def filled(loaded, small_calibration):
    """Per text: a cache of TIER after 96 prefilled tokens and 32 more one at a time."""
    caches = {}
    with torch.inference_mode():
        for text in TEXTS:
            ids = text_windows(loaded.tokenizer, SIZE_TEXTS[text](), 1, 128, text)
            cache = make_cache(loaded.model.config, TIER, calibration=small_calibration)
            loaded.model(ids[:, :96], cache=cache)
            for t in range(96, 128):
                loaded.model(ids[:, t : t + 1], cache=cache)
            cache.flush()
            caches[text] = cache
    return caches


@pytest.mark.parametrize("text", TEXTS)
def test_every_layer_keeps_its_share_and_all_layers_the_budget_at_every_chunk_boundary(filled, text):
    cache = filled[text]
    together = torch.zeros(16, dtype=torch.float64)
    for index, layer in enumerate(cache.layers):
        assert isinstance(layer, PCALayer) and len(layer.chunks) == 16
        budget = layer.coder.budget(SPEC.bits_per_element * layer.share, 1)
        sink = layer.chunks[0].sink_bytes
        assert sink > 0 and all(c.sink is None for c in layer.chunks[1:]), "position 0 is coded apart"
        running = 0
        for j, chunk in enumerate(layer.chunks):
            running += len(chunk.stream) + LENGTH_BYTES + HEADER_BYTES + chunk.sink_bytes
            tokens = (j + 1) * layer.unit
            limit = SPEC.bits_per_element * layer.share / 8 * 384 * tokens + (0 if tokens >= REPAY_TOKENS else sink)
            assert running <= limit, f"{text}, layer {index}, chunk {j}: {running} bytes > {limit:.0f}"
            assert running <= budget.allowed(tokens, sink)
            together[j] += running
    tokens = torch.arange(1, 17) * 8
    paid = tokens >= REPAY_TOKENS
    limit = SPEC.bits_per_element / 8 * 384 * tokens * len(cache.layers)
    assert bool((together[paid] <= limit[paid]).all()), f"{text}: the layers together exceed the tier's budget"
    fp = cache.footprint()
    assert fp.steady_state_ratio <= SPEC.bits_per_element / 16, f"{text}: {fp.steady_state_ratio:.4f}"


def test_budget_shares_follow_the_calibrated_bits_and_keep_the_total(small_calibration):
    shares = calibration.budget_shares(small_calibration)
    assert sorted(shares) == sorted(small_calibration.coders)
    assert sum(shares.values()) == pytest.approx(len(shares), rel=1e-9), "equal elements: the shares average 1"
    bits = {i: float(c.component_bits.sum()) for i, c in small_calibration.coders.items()}
    costly, cheap = max(bits, key=bits.get), min(bits, key=bits.get)
    assert shares[costly] > 1 > shares[cheap], "a layer that costs more at the common step gets more of the budget"
    subset = calibration.budget_shares(small_calibration, [cheap, costly, 3])
    assert sorted(subset) == sorted({cheap, costly, 3}) and sum(subset.values()) == pytest.approx(len(subset))


def test_a_schedule_shares_the_budget_among_the_layers_of_its_pca_tier(loaded, small_calibration):
    per_layer = {i: "int8" for i in range(10)}  # layers 10-29 keep the PCA tier
    cache = make_cache(loaded.model.config, TIER, calibration=small_calibration, per_layer=per_layer)
    pca = {i: layer.share for i, layer in enumerate(cache.layers) if isinstance(layer, PCALayer)}
    assert sorted(pca) == list(range(10, 30))
    assert pca == pytest.approx(calibration.budget_shares(small_calibration, range(10, 30)))


def test_the_step_follows_the_text(filled):
    """Repeated tokens are cheap: finer steps than on numbers, which cost more than the calibration text."""
    def mean_step(text):
        rungs = [c.rung for layer in filled[text].layers for c in layer.chunks if c.rung != SKIP]
        return sum(2 ** (LADDER[r] / 4) for r in rungs) / len(rungs)

    assert mean_step("repeated") < mean_step("numbers"), "an easy text takes finer steps than a hard one"
    assert len({c.rung for layer in filled["code"].layers for c in layer.chunks}) > 1, "the step varies by chunk"


def test_decoded_view_is_what_the_chunks_decode_to(filled):
    layer = filled["numbers"].layers[7]
    keys, values = layer.coder.decode(layer.chunks, 0, layer.unit, 1, layer.keys.dtype)
    assert torch.equal(layer.keys[:, :, :128], keys) and torch.equal(layer.values[:, :, :128], values)


def test_budget_choose_takes_the_finest_rung_that_fits_and_skips_when_none_does():
    budget = RateBudget(bits_per_element=1.0, elements_per_token=64)  # 8 bytes per token, 64 per 8-token chunk
    overhead = LENGTH_BYTES + HEADER_BYTES
    costs = torch.tensor([[70] + [64 - overhead] * (SKIP - 1),  # rung 0 too big: rung 1
                          [500] * SKIP,  # nothing fits: skipped
                          [40] * SKIP])  # fits, with what the skipped chunk left
    assert budget.choose(costs, [0, 0, 0], Spent(), 8) == [1, SKIP, 0]
