"""The app's handlers called directly: streaming, stats, clear errors for bad input, nothing left alive."""

import gc

import gradio as gr
import pytest

import app
from codeckv.cache import CodecCache

PLAIN = [False, 8, 0, "4", "same", 32, True, 0, 0]  # Advanced accordion untouched: use the preset


def _turn(message, tier="png", tokens=12, advanced=PLAIN, native=None, codec=None, materialization_free=False):
    model = "smollm2-135m"
    return list(app.chat_turn(message, native or [], codec or [], model, tier, tokens, materialization_free, *advanced))


def test_chat_streams_both_panels_and_reports_stats():
    updates = _turn("What is the capital of France?", tier="png")
    assert len(updates) > 3, "the answer must stream, not arrive at once"
    native, codec, native_stats, codec_stats, cleared = updates[-1]
    assert native[-1]["role"] == codec[-1]["role"] == "assistant"
    assert "Paris" in native[-1]["content"] and native[-1]["content"] == codec[-1]["content"]
    assert "token match **100%**" in codec_stats and "ΔNLL of the turn **+0.00%**" in codec_stats
    assert "of bf16" in native_stats and cleared == ""
    lengths = [len(u[1][-1]["content"]) for u in updates]
    assert lengths == sorted(lengths), "the codec panel fills progressively"


def test_multi_turn_keeps_the_conversation():
    first = _turn("My name is Ada.", tokens=8)[-1]
    second = _turn("What is my name?", tokens=8, native=first[0], codec=first[1])[-1]
    assert [m["role"] for m in second[0]] == ["user", "assistant", "user", "assistant"]
    assert len(second[1]) == 4


@pytest.mark.parametrize(
    "message, advanced, expected",
    [
        ("   ", PLAIN, "empty"),
        ("hi", [True, 8, 9, "4", "same", 32, True, 0, 0], "allowed: \\[1, 2, 3, 4, 5, 6, 7, 8\\]"),
        ("hi", [True, 8, 0, "5", "same", 32, True, 0, 0], "not supported"),
        ("word " * 9000, PLAIN, "context of 8192 tokens"),
    ],
)
def test_bad_input_gives_a_clear_error(message, advanced, expected):
    with pytest.raises(gr.Error, match=expected):
        _turn(message, advanced=advanced)


def test_custom_tier_from_advanced_settings_runs():
    native, codec, _, codec_stats, _ = _turn("Name a colour.", advanced=[True, 8, 4, "8", "same", 64, False, 4, 16])[-1]
    assert codec[-1]["content"] and "**custom**" in codec_stats


def test_materialization_free_turn_matches_native():
    question = "What is the capital of France?"
    native, codec, _, codec_stats, _ = _turn(question, tier="png", materialization_free=True)[-1]
    assert codec[-1]["content"] == native[-1]["content"] and "token match **100%**" in codec_stats


def test_unknown_model_is_a_clear_error():
    with pytest.raises(gr.Error, match="unknown model 'no-such-model'"):
        app.model_panel("no-such-model")


def test_model_panel_describes_the_model():
    text, layers, heads = app.model_panel("smollm2-135m")
    assert "smollm2-135m" in text and "KV bytes/token of a bf16 cache: 23,040" in text
    assert layers["maximum"] == 29 and heads["maximum"] == 2


def test_inspect_returns_figures_and_summary():
    *figures, summary = app.inspect_kv(app.INSPECT_TEXT, "smollm2-135m", "jpeg-k2", *PLAIN, 3, 1, "V")
    assert len(figures) == 4 and all(f is not None for f in figures)
    assert "layer 3, head 1" in summary and "PSNR" in summary and "inf dB" not in summary


def test_sweep_over_two_tiers(tmp_path):
    table, *figures, files, result, choice = app.run_sweep(
        "Say hello.", "smollm2-135m", ["png", "int8"], 8, progress=lambda *a, **k: None
    )
    assert [row[0] for row in table] == ["png", "int8"]
    assert all(f is not None for f in figures)
    assert [p.rsplit(".", 1)[-1] for p in files] == ["csv", "json"]
    assert choice["choices"] == list(result.comparisons)


def test_no_cache_outlives_its_request():
    for _ in range(2):
        _turn("Count to three.", tier="turbo-4", tokens=8)
    gc.collect()
    alive = [o for o in gc.get_objects() if isinstance(o, CodecCache)]
    assert alive == [], f"{len(alive)} codec caches are still referenced after the requests ended"
