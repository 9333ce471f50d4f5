"""FP8 with static scales per layer and KV head, calibrated on the model as llm-compressor calibrates them."""

import pytest

from codeckv import load_cache
from codeckv.cache import make_cache
from codeckv.cache.kv_scales import kv_scales
from codeckv.tiers import TIERS


def test_each_layer_gets_its_heads_absmax_over_448_and_the_file_resumes(loaded, tmp_path):
    scales = kv_scales(loaded)
    assert sorted(scales.layers) == list(range(30)) and scales.layers[0][0].shape == (3,)
    assert kv_scales(loaded).layers[7][1].equal(scales.layers[7][1]), "read back from disk as computed"
    cache = make_cache(loaded, "fp8-e4m3-cal")
    for index in (0, 29):
        keys, values = scales.layers[index]
        layer = cache.layers[index]
        assert layer.tier.key.scale == pytest.approx(tuple((keys / 448).tolist()))
        assert layer.tier.value.scale == pytest.approx(tuple((values / 448).tolist()))
    assert set(cache.attention.values()) == {"view"}, "no kernel reads scaled fp8 rows"
    ids = loaded.tokenizer("The history of printing", return_tensors="pt").input_ids
    out = loaded.model.generate(ids, cache=cache, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 12 and 0 < cache.footprint().ratio <= 2.0
    size = cache.save(tmp_path / "fp8.kvc", out[0, :-1], loaded)
    saved = load_cache(tmp_path / "fp8.kvc", loaded)
    assert size > 0 and saved.cache.layers[3].tier == cache.layers[3].tier, "the scales come back from the model"


def test_without_the_model_the_calibrated_tier_says_what_to_do(loaded):
    with pytest.raises(ValueError, match="FP8 scales calibrated per layer and head: make_cache\\(loaded"):
        make_cache(loaded.model.config, TIERS["fp8-e4m3-cal"])
