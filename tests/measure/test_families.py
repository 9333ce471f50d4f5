"""Every transformers family of codeckv.measure.families runs every tier, on a view and on the codes, or is refused
when the cache is made with the reason: a tiny random-weight model per family (CPU seconds each)."""

import pytest

from codeckv.measure.families import FAMILIES, check_family
from codeckv.tiers import TIERS, pca_tier, with_boundary

# One preset per code path a family's cache can take, and a PCA tier built at another budget: the presets left out
# run the same code at another count (a press at 75%, a DCT at another k, e5m2 beside e4m3, PCA at other rates, the
# other budget presses). 46 families x every preset took 6 minutes of the suite; `python -m codeckv families` runs
# them all.
SAME_PATH_AS_KEPT = {"jpeg-k4", "jpeg-k2-int8", "fp8-e5m2", "pca-5x", "pca-16x", "pca-32x", "streamingllm-budget256",
                     "tova-budget256", "snapkv-75+turbo-4", "vllm-tq-4bit-nc", "vllm-tq-k3v4-nc"}
# vLLM's presets keep their first and last 2 layers native, which are every layer of a 4-layer tiny model (refused:
# tests/cache/test_schedule.py): their codecs run here with every layer coded, FP8 keys and Lloyd-Max keys.
TIER_LIST = [*(t for t in TIERS.values() if t.name not in SAME_PATH_AS_KEPT and not t.boundary
               and (t.press is None or t.press.ratio in (0.0, 0.5))),
             *(with_boundary(t, 0) for t in TIERS.values() if t.boundary and t.name not in SAME_PATH_AS_KEPT),
             pca_tier(3.2)]
NO_FULL_ATTENTION = {"mistral", "gemma3_text", "falcon_h1", "recurrent_gemma"}  # windows, hybrids
CODES_UNREADABLE = {  # why attention cannot read the codes of these families' caches (cache/reasons.py codes_reason)
    "falcon": "does not attend through codeckv's attention", "bloom": "does not attend through codeckv's attention",
    "mpt": "does not attend through codeckv's attention", "gpt_oss": "does not attend through codeckv's attention",
    "deepseek_v2": "multi-head latent attention", "deepseek_v3": "multi-head latent attention",
    "minicpm3": "multi-head latent attention", "gemma2": "does not attend through codeckv's attention",
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_tier_runs_on_every_family_or_is_refused_with_its_reason(family):
    results = check_family(family, TIER_LIST)
    failed = [f"{r.tier} ({r.mode}): {r.detail}" for r in results if r.outcome == "failed"]
    assert not failed, f"{family}: {failed}"
    outcome = {(r.tier, r.mode): r for r in results}
    assert outcome["native", "view"].outcome == "same tokens", "native through codeckv's attention is the model's own"
    assert outcome["png", "view"].outcome == "same tokens", "png is lossless: native's greedy tokens"
    for tier in TIER_LIST[1:]:
        view, codes = outcome[tier.name, "view"], outcome[tier.name, "codes"]
        if tier.joint is not None and family in NO_FULL_ATTENTION:
            assert view.outcome == codes.outcome == "refused", f"{family} {tier.name}: no full-attention layer"
            assert "PCA tiers code full-attention layers only" in view.detail
            continue
        if tier.press is not None and family in CODES_UNREADABLE:
            assert view.outcome == codes.outcome == "refused", f"{family} {tier.name}: a press needs the queries"
            assert "evicts tokens after each prefill chunk's attention" in view.detail, view.detail
            continue
        assert view.outcome in ("same tokens", "runs"), f"{family} {tier.name} on a view: {view.detail}"
        if family in CODES_UNREADABLE:
            assert codes.outcome == "refused" and CODES_UNREADABLE[family] in codes.detail, f"{family} {tier.name}"
        elif tier.joint is not None:
            assert codes.outcome == "refused" and "entropy-coded chunks, which no kernel reads" in codes.detail
        else:
            assert codes.outcome in ("same tokens", "runs"), f"{family} {tier.name} on the codes: {codes.detail}"
    if family not in CODES_UNREADABLE:
        assert outcome["png", "codes"].outcome == "same tokens", "png on the codes is lossless too"


def test_the_table_covers_the_families_people_bring():
    """At least the 19 decoder families first measured, Gemma, Falcon, Qwen3-Next and what people are likely to run."""
    wanted = {"llama", "qwen2", "qwen3", "phi3", "olmo2", "granite", "gpt_neox", "phi", "stablelm", "gpt2", "mixtral",
              "qwen3_moe", "cohere", "starcoder2", "deepseek_v2", "deepseek_v3", "gemma2", "mistral", "gemma3_text",
              "gemma", "falcon", "qwen3_next", "gpt_oss", "falcon_h1", "llama4_text"}
    assert wanted <= set(FAMILIES) and len(FAMILIES) >= 40
