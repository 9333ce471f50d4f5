"""Per-layer schedules (cache/schedule.py): parsed from text, checked against the model, built layer by layer."""

import dataclasses

import pytest
import torch

from codeckv.cache import CODES, VIEW, CodecCache, make_cache, steady_state_ratio, view_reason
from codeckv.cache.attention import use_codec_attention
from codeckv.cache.coded_layer import CodedLayer
from codeckv.cache.layers import CodecLayer
from codeckv.cache.schedule import MAX_SCHEDULE_CHARS, boundary_layers, layers_text, parse_layers, ranges, schedule
from codeckv.measure.generate import next_logits
from codeckv.measure.runs import attention_counts
from codeckv.serve.formatting import attention_text
from codeckv.tiers import TIERS, get_tier


@pytest.mark.parametrize("text, want", [
    ("", {}),
    ("5:int8", {5: "int8"}),
    (" 0-2 : int8 ,29:turbo-3, ", {0: "int8", 1: "int8", 2: "int8", 29: "turbo-3"}),
    ("3-3:pca-8x", {3: "pca-8x"}),
])
def test_parse_layers_reads_entries_and_ranges(text, want):
    assert parse_layers(text) == want


@pytest.mark.parametrize("text, match", [
    ("0-3", "is not 'layer:tier'"),
    ("a:int8", "is not 'layer:tier'"),
    ("-1:int8", "is not 'layer:tier'"),
    ("4-2:int8", "runs backwards"),
    ("0:int9", r"unknown tier 'int9' \(allowed: native, png"),
    ("0-3:int8, 3:turbo-3", "layer 3 is given a tier twice"),
    ("0:int8, " * 100, f"allowed: at most {MAX_SCHEDULE_CHARS}"),
])
def test_parse_layers_refuses_bad_text_with_what_is_allowed(text, match):
    with pytest.raises(ValueError, match=match):
        parse_layers(text)


def test_text_round_trips_through_the_compact_form():
    per_layer = {0: "int8", 1: "int8", 2: "int8", 5: "turbo-3", 6: "int8", 29: "turbo-3"}
    assert layers_text(per_layer) == "0-2:int8, 5:turbo-3, 6:int8, 29:turbo-3"
    assert parse_layers(layers_text(per_layer)) == per_layer
    assert ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"


def test_a_schedule_is_a_tier_whose_layers_differ():
    tier = schedule("turbo-4", {5: "int8", 2: TIERS["turbo-3"]})
    assert tier.name == "turbo-4 · 2:turbo-3, 5:int8" and tier.per_layer[0][0] == 2
    assert tier.tier_at(5) == TIERS["int8"] and tier.tier_at(2) == TIERS["turbo-3"]
    assert tier.tier_at(0).key == TIERS["turbo-4"].key and not tier.tier_at(0).per_layer
    assert schedule("turbo-4", {2: "turbo-4"}) == TIERS["turbo-4"], "an override equal to the base is no override"
    assert not schedule("native", {2: "int8"}).is_native and schedule("native", {}).is_native
    with pytest.raises(ValueError, match="already has a per-layer schedule"):
        schedule(tier, {0: "int8"})
    with pytest.raises(ValueError, match="layer index -1 must be a whole number"):
        schedule("turbo-4", {-1: "int8"})
    with pytest.raises(ValueError, match="steady_state_ratio|per-layer schedule"):
        steady_state_ratio(tier, 64)


def test_each_attention_layer_gets_its_own_tier_its_windows_too(tiny_gemma3):
    cache = make_cache(tiny_gemma3.config, "turbo-4", per_layer={5: "int8", 1: "jpeg-k8-int8"})
    assert isinstance(cache, CodecCache) and cache.tier.per_layer == ((1, TIERS["jpeg-k8-int8"]), (5, TIERS["int8"]))
    kinds = [type(layer).__name__ for layer in cache.layers]
    assert kinds == ["CodecLayer"] * 6, "a model not routed through codeckv.cache.attention gets views"
    assert cache.layers[5].tier == TIERS["int8"] and cache.layers[2].tier.key == TIERS["turbo-4"].key
    assert cache.layers[1].tier == TIERS["jpeg-k8-int8"] and cache.layers[1].window == 16
    only = make_cache(tiny_gemma3.config, "native", per_layer={5: "turbo-3"})
    assert [type(layer).__name__ for layer in only.layers[:3]] == ["DynamicSlidingWindowLayer"] * 2 + ["DynamicLayer"]
    assert isinstance(only.layers[5], CodecLayer)


@pytest.mark.parametrize("per_layer, match", [
    ({0: "pca-8x"}, r"layer 0 is a sliding_attention layer, which PCA tiers leave native.*allowed: the full-attention "
                    r"layers 2, 5, or a per-tensor tier"),
    ({6: "int8"}, r"layer 6 does not exist: the model has 6 layers \(allowed: the attention layers 0-5\)"),
    ({2: "int9"}, r"unknown tier 'int9' \(allowed: native, png"),
    ({2: "pca-8x"}, "needs the model's calibration"),
])
def test_impossible_schedules_are_refused_with_the_allowed_values(tiny_gemma3, per_layer, match):
    with pytest.raises(ValueError, match=match):
        make_cache(tiny_gemma3.config, "turbo-4", per_layer=per_layer)


def test_a_pca_layer_cannot_be_asked_to_attend_on_its_codes(tiny_gemma3):
    use_codec_attention(tiny_gemma3)  # the model itself could attend on codes
    with pytest.raises(ValueError, match="materialization_free=True is not supported"):
        make_cache(tiny_gemma3.config, "int8", True, per_layer={5: "pca-8x"})
    reason = view_reason(schedule("int8", {5: "pca-8x"}))
    assert reason.startswith("layer 5 (pca-8x): keys and values are coded together")
    assert view_reason(schedule("native", {5: "turbo-4"})) is None


@torch.inference_mode()
def test_a_scheduled_layer_stores_what_the_same_tier_stores_alone(tiny_gemma3):
    """Layer 5 under int8 in a turbo-4 schedule holds the bytes and the view of layer 5 of a uniform int8 cache."""
    use_codec_attention(tiny_gemma3)
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(3))
    mixed = make_cache(tiny_gemma3.config, "turbo-4", False, per_layer={5: "int8"})
    uniform = {name: make_cache(tiny_gemma3.config, name, False) for name in ("int8", "turbo-4")}
    for cache in (mixed, *uniform.values()):
        next_logits(tiny_gemma3, ids, cache)
        cache.flush()
    got = mixed.footprint().layers
    int8, turbo = (uniform[name].footprint().layers for name in ("int8", "turbo-4"))
    assert got[5].archive_bytes == int8[5].archive_bytes and got[2].archive_bytes == turbo[2].archive_bytes
    assert got[5].archive_bytes != got[2].archive_bytes
    assert torch.equal(mixed.layers[2].keys, uniform["turbo-4"].layers[2].keys), "layer 2 is coded as turbo-4 alone"
    on_codes = make_cache(tiny_gemma3.config, "turbo-4", None, per_layer={5: "int8"})
    assert all(type(layer) is CodedLayer for layer in on_codes.layers), "each layer on its codes where its tier allows"
    assert on_codes.attention == dict.fromkeys(range(6), CODES)
    mixed = make_cache(tiny_gemma3.config, "turbo-4", None, per_layer={5: "png"})
    assert mixed.attention == {**dict.fromkeys(range(5), CODES), 5: VIEW}, "png: a view"
    assert attention_text(attention_counts(mixed)) == \
        "on the stored codes in 5 of 6 layers, on a decoded view in the others", "the app phrases the modes"


@torch.inference_mode()
def test_a_native_prefill_converts_into_a_schedule_its_windows_too(tiny_gemma3):
    from transformers import DynamicCache

    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(4))
    native = DynamicCache(config=tiny_gemma3.config)
    next_logits(tiny_gemma3, ids, native)
    converted = CodecCache.from_cache(native, schedule("turbo-4", {5: "jpeg-k4", 1: "jpeg-k4"}), False)
    assert converted.layers[5].tier == TIERS["jpeg-k4"] and converted.layers[2].tier.key == TIERS["turbo-4"].key
    assert converted.footprint().layers[5].archived_tokens == 40
    assert converted.layers[1].window == 16 and converted.footprint().layers[1].archived_tokens == 8, \
        "the window's 15 tokens from position 25: a unit archived (32-39), the rest raw"
    with pytest.raises(ValueError, match="layer 1 is a sliding_attention layer, which PCA tiers leave native"):
        CodecCache.from_cache(native, schedule("turbo-4", {1: "pca-8x"}))


@pytest.mark.parametrize("kinds, boundary, want", [
    (["full_attention"] * 24, 2, [0, 1, 22, 23]),  # vLLM's get_boundary_skip_layers on a dense model
    (["full_attention"] * 3, 2, [0, 2]),  # never more than half the layers: min(2, 3 // 2) on each side
    (["sliding_attention", "full_attention"] * 3, 1, [0, 5]),  # sliding-window layers count as layers
    (["linear_attention", "full_attention"] * 4, 2, []),  # a hybrid: vLLM protects none
    (["full_attention"] * 24, 0, []),
])
def test_boundary_layers_are_the_ones_vllm_keeps_native(kinds, boundary, want):
    tier = dataclasses.replace(TIERS["turbo-3"], boundary=boundary)
    assert boundary_layers(tier, kinds) == want


def test_a_tier_with_boundary_layers_keeps_them_native_in_the_cache(tiny_gemma3):
    cache = make_cache(tiny_gemma3.config, "vllm-tq-3bit-nc")
    assert cache.tier.name == "vllm-tq-3bit-nc" and cache.tier.boundary == 0, "the schedule keeps the preset's name"
    kinds = [type(layer).__name__ for layer in cache.layers]
    assert kinds == ["DynamicSlidingWindowLayer"] * 2 + ["CodecLayer"] * 2 + ["DynamicSlidingWindowLayer",
                                                                            "DynamicLayer"]
    everywhere = make_cache(tiny_gemma3.config, "vllm-tq-3bit-nc-skip0")
    assert [type(layer).__name__ for layer in everywhere.layers] == ["CodecLayer"] * 6
    turbo = make_cache(tiny_gemma3.config, "turbo-3-skip1")
    assert [i for i, layer in enumerate(turbo.layers) if isinstance(layer, CodecLayer)] == [1, 2, 3, 4]
    with pytest.raises(ValueError, match=r"first and last 3 layers native \(vLLM's rule\), which are all 6 layers of "
                                         r"this model.*allowed: a model of more than 6 layers, or 'turbo-3-skip0'"):
        make_cache(tiny_gemma3.config, "turbo-3-skip3")


def test_boundary_tiers_are_named_and_refused_where_they_cannot_be():
    tier = get_tier("turbo-3-skip2")
    assert tier.boundary == 2 and tier.key == TIERS["turbo-3"].key and tier.description.endswith(
        "first and last 2 layers native")
    every = get_tier("vllm-tq-3bit-nc-skip0")
    assert every.boundary == 0 and every.description.endswith("every layer coded")
    for name, match in (("pca-8x-skip2", "cannot keep boundary layers native"), ("native-skip2", "cannot keep"),
                        ("turbo-9-skip2", "unknown tier"), ("turbo-3-skip200", "unknown tier")):
        with pytest.raises(ValueError, match=match):
            get_tier(name)
    with pytest.raises(ValueError, match="boundary layers and a per-layer schedule together"):
        dataclasses.replace(schedule("turbo-4", {0: "int8"}), boundary=2)
