"""KV inspection: png reconstructs exactly, lossy tiers keep the tail raw, spectra obey Parseval."""

import math

import pytest
import torch

from codeckv.measure.inspection import dct_energy, inspect_capture, kept_fraction, var_delta_ratio
from codeckv.tiers import TIERS


def test_png_error_heatmap_is_all_zeros(capture):
    view = inspect_capture(capture, TIERS["png"], layer=2, head=1)
    zeros = torch.zeros_like(view.head.key)
    torch.testing.assert_close(view.head.key_error, zeros, rtol=0, atol=0, msg="png key |error| must be 0")
    torch.testing.assert_close(view.head.value_error, torch.zeros_like(view.head.value), rtol=0, atol=0,
                               msg="png value |error| must be 0")
    assert view.head.archived[1] > 0, "png must really have archived blocks"
    assert all(e.key_rel_error == 0 and e.key_psnr_db == math.inf and e.attention_rel_error == 0 for e in view.layers)


def test_lossy_tier_archives_complete_blocks_and_keeps_the_tail_raw(capture):
    view = inspect_capture(capture, TIERS["jpeg-k2"], layer=0, head=0)
    tokens = len(capture.token_ids)
    start, end = view.head.archived
    assert (start, end) == (0, tokens // 8 * 8)
    torch.testing.assert_close(view.head.key_recon[end:], view.head.key[end:], rtol=0, atol=0,
                               msg="the incomplete tail stays at full precision")
    assert view.head.key_error[:end].max() > 0
    layer = view.layers[0]
    assert 0 < layer.key_rel_error < 1 and 0 < layer.key_cosine < 1 and math.isfinite(layer.key_psnr_db)
    assert 0 <= layer.attention_rel_error and 0 < layer.key_var_ratio < 4
    assert view.spectrum.block_size == 8 and view.spectrum.k == 2


@pytest.mark.parametrize("shape", [(1, 8, 1), (3, 37, 64), (2, 64, 5)])
def test_dct_spectrum_sums_to_the_block_energy(shape):
    torch.manual_seed(0)
    x = torch.randn(shape).cumsum(1)  # (H, S, D) smooth along the sequence
    r = 8
    energy = dct_energy(x, r)
    blocks = x[:, : shape[1] // r * r].reshape(shape[0], -1, r, shape[2])
    torch.testing.assert_close(energy.sum(), blocks.pow(2).sum(2).mean(), rtol=1e-5, atol=1e-6,
                               msg="Parseval: DCT energies sum to the mean block energy")
    assert energy[0] > energy[-1], "a random walk has most energy in low frequencies"
    torch.testing.assert_close(kept_fraction(energy[None], r), torch.ones(1), msg="all frequencies keep everything")


def test_spectrum_of_real_keys_obeys_parseval(capture):
    keys = capture.keys[5].float()  # (H, S, D)
    blocks = keys[:, : keys.shape[1] // 8 * 8].reshape(keys.shape[0], -1, 8, keys.shape[2])
    torch.testing.assert_close(dct_energy(keys, 8).sum(), blocks.pow(2).sum(2).mean(), rtol=1e-4, atol=1e-5,
                               msg="Parseval on captured keys")


def test_var_delta_ratio_of_white_noise_is_two():
    torch.manual_seed(0)
    ratio = var_delta_ratio(torch.randn(4, 4000, 16))
    assert abs(ratio - 2) < 0.1, ratio


def test_a_schedule_shows_each_layer_with_its_tier_and_bytes(capture):
    from codeckv.cache.schedule import schedule

    view = inspect_capture(capture, schedule("turbo-4", {0: "jpeg-k4", 29: "jpeg-k2"}), layer=0, head=0)
    tiers = [e.tier for e in view.layers]
    assert tiers[0] == "jpeg-k4" and tiers[29] == "jpeg-k2" and tiers[5].startswith("turbo-4")
    ratios = {e.tier: e.ratio_vs_bf16 for e in view.layers}
    # the short capture fills no 32-token turbo unit (its tokens stay raw, fp32: 2x bf16), but 8-token ones
    assert ratios["jpeg-k2"] < ratios["jpeg-k4"] < ratios[tiers[5]] == 2.0, "each layer: its own tier's bytes"
    uniform = inspect_capture(capture, TIERS["jpeg-k4"], layer=0, head=0)
    assert view.layers[0].key_rel_error == uniform.layers[0].key_rel_error, "layer 0 is coded as jpeg-k4 alone"
    with pytest.raises(ValueError, match="layer 30 does not exist"):
        inspect_capture(capture, schedule("turbo-4", {30: "int8"}))


def test_inspect_shows_which_tokens_a_press_kept(loaded):
    from codeckv.measure.inspection import inspect_tier
    from codeckv.tiers import get_tier

    view = inspect_tier(loaded, "The history of printing begins in East Asia. " * 12, get_tier("tova-75"), 2, 1)
    kept, tokens = view.head.kept, len(view.tokens)
    assert kept is not None and int(kept.sum()) == tokens // 4, "a quarter of the prompt's tokens kept (rounded down)"
    assert torch.isnan(view.head.key_recon[~kept]).all() and not torch.isnan(view.head.key_recon[kept]).any()
    assert view.layers[2].kept_pct == pytest.approx(100 * (tokens // 4) / tokens) and bool(kept[-1])
    assert view.summary()["kept_tokens"] == int(kept.sum())
