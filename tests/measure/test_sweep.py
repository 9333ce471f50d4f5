"""Tier sweep: one row per tier, the lossless png row is exact, progress is reported."""

import math

import torch


def test_sweep_over_two_tiers_reports_both(swept):
    result, _ = swept
    assert [r.tier for r in result.rows] == ["png", "jpeg-k2"]
    assert len(result.native.token_ids) == 10
    for row in result.rows:
        assert row.archive_bytes > 0 and row.bf16_bytes > 0
        assert math.isfinite(row.delta_nll_pct) and math.isfinite(row.latency_ratio) and row.decode_ms > 0
        assert row.native_decode_ms == result.native.decode_ms, "every tier is compared with the one native run"
    png, jpeg = result.rows
    assert jpeg.archive_bytes < png.archive_bytes, "jpeg-k2 keeps 2 of 8 DCT coefficients"
    assert jpeg.psnr_db < 60


def test_png_row_is_exact(swept):
    result, _ = swept
    png = result.rows[0]
    assert png.delta_nll_pct == 0.0 and png.token_match == 1.0 and png.first_divergence is None
    assert png.psnr_db == math.inf
    cmp = result.comparisons["png"]
    torch.testing.assert_close(
        torch.tensor(cmp.token_nll_codec), torch.tensor(cmp.token_nll_native), rtol=0, atol=0,
        msg="png is lossless: per-token NLL must equal the native cache's",
    )


def test_progress_reaches_the_total_monotonically(swept):
    _, calls = swept
    done = [d for d, _ in calls]
    assert done == sorted(done) and calls[-1][0] == calls[-1][1]


def test_calibrated_fp8_scales_reach_the_psnr_of_each_layer(loaded):
    from codeckv.measure.sweep import sweep
    from codeckv.tiers import TIERS
    from tests.measure.conftest import CHAT

    result = sweep(loaded, CHAT, [TIERS["fp8-e4m3-cal"], TIERS["fp8-e4m3"]], max_new_tokens=4, stop_at_eos=False)
    calibrated, static = result.rows
    assert math.isfinite(calibrated.psnr_db) and math.isfinite(static.psnr_db)
    assert calibrated.psnr_db != static.psnr_db, "each layer's calibrated scales, not the static 1.0"
