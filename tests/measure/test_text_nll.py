"""NLL comparisons on user text and on the embedded corpus, per token."""

import torch

from codeckv.measure.text_nll import compare_nll


def test_png_on_user_text_changes_no_token(loaded, text):
    cmp = compare_nll(loaded, "png", text=text)
    assert cmp.source == "text" and len(cmp.tokens) == cmp.native.token_nll.numel() > 0
    torch.testing.assert_close(cmp.token_delta, torch.zeros_like(cmp.token_delta), rtol=0, atol=0,
                               msg="png is lossless on any text")
    assert cmp.delta_nll_pct == 0.0


def test_lossy_tier_on_the_corpus_reports_per_token_nll(loaded):
    cmp = compare_nll(loaded, "jpeg-k2", windows=1, length=40)
    assert cmp.source == "corpus" and cmp.native.token_nll.shape == cmp.codec.token_nll.shape == (19,)
    assert cmp.token_delta.abs().sum() > 0 and cmp.summary()["positions"] == 19
