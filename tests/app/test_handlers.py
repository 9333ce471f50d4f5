"""The app's handlers called directly: streaming, stats, long documents, clear errors, caches released on Clear."""

import gc
import math
import sys

import gradio as gr
import pytest

import app
import codeckv.cache.calibration as calibration
import tabs.inspect as inspect_tab
import tabs.long_context as long_context_tab
import tabs.reasoning as reasoning_tab
import tabs.sweep as sweep_tab
from codeckv.cache import CODES, SHORT_VIEW, VIEW, CodecCache
from codeckv.cache.coded_layer import CodedLayer
from codeckv.cache.kernel_ops import attention_compiled
from codeckv.cache.layers import CodecLayer
from codeckv.cache.pca_layer import PCALayer, tokens_before_coder
from codeckv.measure.chat import ChatSession
from codeckv.serve import service
from codeckv.serve.formatting import ATTENTION_WORDS as WORDS
from codeckv.serve.inputs import DOCUMENTS
from codeckv.serve.sessions import IdleSessions
from codeckv.tiers import TIERS

PLAIN = [False, 8, 0, "4", "same", 32, True, 0, 0, ""]  # Advanced accordion untouched: use the preset


def _turbo_compiled() -> bool:
    """True where the compiled CPU kernel reads turbo-4's (and int8's) codes (smollm2: head_dim 64)."""
    return attention_compiled(TIERS["turbo-4"].key, TIERS["turbo-4"].value, 64)


def _turn(message, tier="png", tokens=12, advanced=PLAIN, session=None, decoded_view=False, document=None,
          upload=None):
    model = "smollm2-135m"
    args = (message, document, upload, model, tier, tokens, decoded_view, *advanced, session)
    return list(app.chat_turn(*args))


def test_chat_streams_both_panels_and_reports_stats():
    updates = _turn("What is the capital of France?", tier="png")
    assert len(updates) > 3, "the answer must stream, not arrive at once"
    native, codec, native_stats, codec_stats, cleared, document, upload, session = updates[-1]
    assert native[-1]["role"] == codec[-1]["role"] == "assistant"
    assert "Paris" in native[-1]["content"] and native[-1]["content"] == codec[-1]["content"]
    assert "KL divergence **0.0000**" in codec_stats and "top-1 agreement **100.0%**" in codec_stats
    assert "token match **100%**" in codec_stats and "steady state" in codec_stats
    assert "of bf16" in native_stats and cleared == "" and document is None and isinstance(session, ChatSession)
    lengths = [len(u[1][-1]["content"]) for u in updates]
    assert lengths == sorted(lengths), "the codec panel fills progressively"


def test_multi_turn_keeps_the_conversation_and_prefills_only_the_new_turn():
    session = _turn("My name is Ada.", tokens=8)[-1][-1]
    second = _turn("What is my name?", tokens=8, session=session)[-1]
    assert [m["role"] for m in second[0]] == ["user", "assistant", "user", "assistant"]
    assert len(second[1]) == 4 and "prefill of " in second[2]
    assert session.runs[0].prompt_tokens < 20, "the second turn prefills its own tokens only"


def test_long_document_turn_shows_real_ratios():
    title = next(iter(DOCUMENTS))
    updates = _turn("What does the finally clause do?", tier="turbo-4", tokens=16, document=title)
    native, codec, _, codec_stats, *_ = updates[-1]
    assert native[0]["content"].startswith(f"[document: {title}"), "the chat shows the document as a note"
    session = updates[-1][-1]
    assert session.exchanges[0].user.startswith("The \"try\" statement"), "the model reads the whole document"
    fp = session.last.result.codec.footprint
    assert fp.archived_tokens > 1800 and abs(fp.ratio - fp.steady_state_ratio) < 0.05, "turn ratio near steady state"


@pytest.mark.parametrize(
    "message, advanced, expected",
    [
        ("   ", PLAIN, "empty"),
        ("\u200b\u200d\ufeff", PLAIN, "empty"),  # zero-width characters only
        ("bad \ud800 surrogate", PLAIN, "invalid character at position 4"),
        ("hi", [True, 8, 9, "4", "same", 32, True, 0, 0, ""],
         "k frequencies kept=9 is out of range \\(allowed: 0..8\\)"),
        ("hi", [True, 8, 0, "5", "same", 32, True, 0, 0, ""], "key bits='5' is not a choice here"),
        ("hi", [True, 10**6, 1, "4", "same", 32, True, 0, 0, ""], "DCT block size=1000000 is out of range"),
        ("hi", [True, 8, 0, "4", "same", 32, True, 10**9, 0, ""], "keep_first=1000000000 is out of range"),
        ("hi", [True, 8, 0, "4", "same", 32, True, 6000, 3000, ""], "leave nothing to archive"),
        ("hi", [True, 8, 0, "4", "same", 48, True, 0, 0, ""], "group=48 must divide head_dim=64"),
        ("hi", [True, 8.5, 0, "4", "same", 32, True, 0, 0, ""], "must be a whole number"),
        ("word " * 9000, PLAIN, "context of 8192 tokens"),
        ("hi", [*PLAIN[:-1], "0:int9"], r"unknown tier 'int9' \(allowed: native, png"),
        ("hi", [*PLAIN[:-1], "30:int8"],
         r"layer 30 does not exist: the model has 30 layers \(allowed: the attention layers 0-29\)"),
        ("hi", [*PLAIN[:-1], "0:int8, " * 100], "allowed: at most 600"),
    ],
)
def test_bad_input_gives_a_clear_error(message, advanced, expected):
    with pytest.raises(gr.Error, match=expected):
        _turn(message, advanced=advanced)


@pytest.mark.parametrize("model", ["/etc", "../models/x", "someone/unlisted-model", "", None, 3])
def test_a_model_that_is_not_listed_is_refused_before_any_loader(model, monkeypatch):
    from codeckv.serve import pool

    monkeypatch.setattr(pool.POOL, "_loader", lambda name: pytest.fail(f"the loader was called for {name!r}"))
    with pytest.raises(gr.Error, match="is not served here \\(allowed: smollm2-135m"):
        app.model_panel(model)
    with pytest.raises(gr.Error, match="not served here"):
        list(app.chat_turn("hi", None, None, model, "png", 8, False, *PLAIN, None))


def test_other_requests_are_bounded_before_they_run():
    with pytest.raises(gr.Error, match="more than the 2,048 allowed"):
        inspect_tab.inspect_kv("word " * 3000, "smollm2-135m", "jpeg-k2", *PLAIN, 0, 0, "K")
    with pytest.raises(gr.Error, match="layer=30 is out of range \\(allowed: 0..29\\)"):
        inspect_tab.inspect_kv("Some text to inspect.", "smollm2-135m", "jpeg-k2", *PLAIN, 30, 0, "K")
    with pytest.raises(gr.Error, match="more than the 4,096 allowed per sweep"):
        _sweep(sweep_tab.LONG_TEXT, ["png"], windows=8, length=1024)
    with pytest.raises(gr.Error, match="tiers='turbo-9' is not a choice here"):
        _sweep(sweep_tab.LONG_TEXT, ["turbo-9"])
    with pytest.raises(gr.Error, match="more than the 40,000 allowed"):
        long_context_tab.run_needle([4096, 8000], ["0%", "25%", "50%", "75%", "100%"], ["turbo-4"], "smollm2-135m",
                       progress=lambda *a, **k: None)


def test_custom_tier_from_advanced_settings_runs():
    advanced = [True, 8, 4, "8", "same", 64, False, 4, 16, ""]
    native, codec, _, codec_stats, *_ = _turn("Name a colour.", advanced=advanced)[-1]
    assert codec[-1]["content"] and "**custom**" in codec_stats


def test_a_per_layer_schedule_from_advanced_settings_runs_with_each_layer_on_its_tier():
    advanced = [*PLAIN[:-1], "0-1:int8, 29:pca-8x"]
    native, codec, _, codec_stats, *_, session = _turn("Name a colour.", tier="turbo-4", advanced=advanced)[-1]
    assert codec[-1]["content"] and "turbo-4 · 0-1:int8, 29:pca-8x" in codec_stats
    # a one-line chat is a short context: the codes layers decode on their own short view (cache/coded_layer.py),
    # except where the compiled CPU kernel reads both sides' codes (turbo-4's layers)
    if _turbo_compiled():  # int8's layers too: the compiled kernel reads every tier without a DCT
        assert (f"{WORDS[CODES]} in 29 of 30 layers, {WORDS[VIEW]} in the others (layer 29 (pca-8x)") in codec_stats
    else:
        assert f"{WORDS[SHORT_VIEW]} in 29 of 30 layers, {WORDS[VIEW]} in the others (layer 29 (pca-8x)" in codec_stats
    layers = session.runs[1].cache.layers
    assert [layers[i].tier.name for i in (0, 1, 29)] == ["int8", "int8", "pca-8x"]
    assert layers[5].tier.key == TIERS["turbo-4"].key


def test_attention_reads_the_codes_by_default_and_the_stats_say_where():
    question = "What is the capital of France?"
    *_, codec_stats, _, _, _, session = _turn(question, tier="turbo-4")[-1]
    if _turbo_compiled():
        assert f"attention {WORDS[CODES]} ·" in codec_stats, "the compiled kernel reads the codes even in a short chat"
    else:
        assert f"attention {WORDS[SHORT_VIEW]}" in codec_stats, "a short chat: the view the cache chose"
    assert "through the codec cache, on the codes" in codec_stats
    *_, codec_stats, _, _, _, _ = _turn(question, tier="jpeg-k8-int8")[-1]
    assert "raw until 2,048 tokens" in codec_stats, "a DCT tier reads a view: raw while a view is as large"
    assert "attention on the raw tokens (nothing archived)" in codec_stats, \
        "a DCT tier reads a decoded view, as large as the raw tokens: a short chat holds them raw, as native"
    assert isinstance(session.runs[1].cache.layers[0], CodedLayer)
    *_, codec_stats, _, _, _, session = _turn(question, tier="turbo-4", decoded_view=True)[-1]
    assert "raw until 2,048 tokens" in codec_stats, "asked for a decoded view: raw while a view would be as large"
    assert type(session.runs[1].cache.layers[0]) is CodecLayer
    native, codec, _, codec_stats, *_ = _turn(question, tier="png")[-1]
    assert "raw at every length" in codec_stats, "png's archive is never smaller than the raw tokens it codes"
    assert codec[-1]["content"] == native[-1]["content"] and "token match **100%**" in codec_stats


def test_stop_keeps_the_partial_turn_and_says_so():
    session = ChatSession()
    stream = app.chat_turn("Count from one to fifty.", None, None, "smollm2-135m", "turbo-4", 64, False, *PLAIN,
                           session)
    for update in stream:
        if len(update[0][-1]["content"]) > 5:
            break
    native, codec, native_stats, codec_stats = app.stop_turn(session)
    stream.close()
    assert "**stopped** after" in native_stats and "not scored" in codec_stats
    assert native[-1]["content"] and session.runs == [] and len(session.exchanges) == 1


def test_model_panel_describes_the_model_and_prepares_it(monkeypatch):
    asked = []
    monkeypatch.setattr(app.PREPARATION, "start", asked.append)  # the real one calibrates in the background
    text, layers, heads, timer = app.model_panel("smollm2-135m")
    assert asked == ["smollm2-135m"], "a chosen model's PCA tiers are calibrated in the background, as the default's"
    assert isinstance(timer, gr.Timer)
    assert "smollm2-135m" in text and "KV bytes/token of a bf16 cache: 23,040" in text
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "png stores integer deltas" in rows["png"], "the panel says why png's attention takes the reference"
    assert "decode_attention_torch (no CUDA device" in rows["turbo-4"]
    assert "no kernel reads entropy-coded chunks" in rows["pca-8x"]
    assert layers["maximum"] == 29 and heads["maximum"] == 2


def test_inspect_returns_figures_and_summary():
    *figures, summary = inspect_tab.inspect_kv(inspect_tab.INSPECT_TEXT, "smollm2-135m", "jpeg-k2", *PLAIN, 3, 1, "V")
    assert len(figures) == 6 and all(f is not None for f in figures)
    assert "layer 3, head 1" in summary and "PSNR" in summary and "inf dB" not in summary


def _sweep(mode, tiers, **overrides):
    args = dict(mode=mode, source=next(iter(sweep_tab.SOURCES)), pasted="", upload=None, windows=2, length=64,
                prompt="Say hello.", new_tokens=8, model_name="smollm2-135m", tier_names=tiers, metric="KL divergence")
    args.update(overrides)
    return sweep_tab.run_sweep(*args.values(), progress=lambda *a, **k: None)


def test_long_text_sweep_reports_spread_and_files():
    table, pareto, latency, match, token_kld, files, result, choice = _sweep(sweep_tab.LONG_TEXT, ["png", "int8"])
    assert [row[0] for row in table["data"]] == ["native", "png", "int8"]
    assert "±" in table["data"][2][5], "KLD carries its standard error over windows"
    assert table["data"][2][4] == table["data"][1][4] == "on a decoded view", "scoring keeps views (quality.py)"
    assert pareto is not None and token_kld is not None and latency["visible"] is False
    assert [p.rsplit(".", 1)[-1] for p in files] == ["csv", "json"]
    assert choice["choices"] == ["png", "int8"]
    assert sweep_tab.sweep_pareto(result, "ΔNLL").layout.yaxis.title.text == "ΔNLL vs native (%)"
    assert sweep_tab.sweep_pareto(result, "PSNR") is None, "an axis that is not offered draws nothing"


def test_one_prompt_sweep_and_pasted_text_sweep():
    table, pareto, *_, result, _ = _sweep(sweep_tab.ONE_PROMPT, ["png", "int8"], metric="ΔNLL")
    assert [row[0] for row in table["data"]] == ["png", "int8"]
    assert pareto.layout.title.text == "Storage vs ΔNLL (one reply)", "one prompt's chart on the axis chosen"
    assert sweep_tab.sweep_pareto(result, "KL divergence").layout.yaxis.title.text.startswith("KL divergence")
    text = "The quick brown fox jumps over the lazy dog. " * 40
    table, *_ = _sweep(sweep_tab.LONG_TEXT, ["int8"], source="pasted text", pasted=text, windows=1)
    assert [row[0] for row in table["data"]] == ["native", "int8"]
    with pytest.raises(gr.Error, match="fewer than 8 windows"):
        _sweep(sweep_tab.LONG_TEXT, ["int8"], source="pasted text", pasted=text, windows=8, length=512)


def test_clear_releases_the_session_caches():
    session = _turn("Count to three.", tier="turbo-4", tokens=8)[-1][-1]
    assert any(isinstance(o, CodecCache) for o in gc.get_objects()), "the conversation keeps its caches"
    app.clear_chat(session)
    gc.collect()
    alive = [o for o in gc.get_objects() if isinstance(o, CodecCache)]
    assert alive == [], f"{len(alive)} codec caches are still referenced after Clear"


def test_a_turn_cancelled_after_its_last_update_leaves_the_next_turn_alone():
    """Clear cancels a turn whose stats are shown but whose generator has not ended; Gradio drops it, and its clean-up
    runs when it is collected, here during the next turn (on a busy CI machine this broke the browser test)."""
    args = (None, None, "smollm2-135m", "turbo-4", 8, False, *PLAIN)
    first = app.chat_turn("Count to three.", *args, None)
    session = next(u for u in first if "token match" in u[3])[-1]
    app.clear_chat(session)
    second = app.chat_turn("What is the capital of France?", *args, session)
    next(second)
    first.close()
    assert "token match" in list(second)[-1][3]


def test_needle_tab_runs_a_small_grid():
    figure, table, path = long_context_tab.run_needle([512], ["0%", "100%"], ["turbo-4"], "smollm2-135m",
                                         progress=lambda *a, **k: None)
    assert [row[0] for row in table["data"]] == ["native", "native", "turbo-4", "turbo-4"]
    assert all(row[4] == "yes" for row in table["data"][:2]), "the embedded model finds the key at 512 tokens"
    assert len(figure.data) == 2 and path.endswith("needle.csv")
    with pytest.raises(gr.Error, match="at least one length"):
        long_context_tab.run_needle([], ["0%"], ["turbo-4"], "smollm2-135m", progress=lambda *a, **k: None)
    with pytest.raises(gr.Error, match="prompt tokens='100' is not a choice"):
        long_context_tab.run_needle([100], ["0%"], ["turbo-4"], "smollm2-135m", progress=lambda *a, **k: None)


def test_stop_during_a_long_prefill_takes_effect_between_chunks():
    session = ChatSession()
    document = next(iter(DOCUMENTS))  # about 2k tokens: four prefill chunks
    stream = app.chat_turn("Summarize it.", document, None, "smollm2-135m", "turbo-4", 16, False, *PLAIN, session)
    native_panel, _, native_stats, *_ = next(stream)
    assert native_stats.startswith("prefilling the prompt… (1/"), "control returns after each prefill chunk"
    _, _, stopped, _ = app.stop_turn(session)
    stream.close()
    assert "while prefilling" in stopped and session.runs == [] and session.exchanges[-1].native == ""


def test_stop_ends_a_running_sweep_at_its_next_step():
    from codeckv.serve.limits import StopFlag

    flag, calls = StopFlag(), []

    def progress(*args, **kwargs):  # the user presses Stop right after the first step
        calls.append(args)
        app.request_stop(flag)

    args = [sweep_tab.LONG_TEXT, next(iter(sweep_tab.SOURCES)), "", None, 1, 64, "", 8, "smollm2-135m", ["png"],
            "KL divergence"]
    with pytest.raises(gr.Error, match="stopped"):
        sweep_tab.run_sweep(*args, flag, progress=progress)
    assert len(calls) == 1
    table, *_ = sweep_tab.run_sweep(*args, flag, progress=lambda *a, **k: None)  # a new run starts afresh
    assert [row[0] for row in table["data"]] == ["native", "png"]


def test_idle_sessions_past_their_memory_bound_give_up_their_caches_and_say_so(monkeypatch):
    monkeypatch.setattr(service, "IDLE", IdleSessions())  # only this test's sessions
    first = _turn("My name is Ada.", tier="turbo-4", tokens=8)[-1][-1]
    held = first.rest()
    assert 0 < held and first.runs, "an idle session keeps its caches while they fit"
    monkeypatch.setenv("CODECKV_MAX_IDLE_MIB", str(math.ceil(1.5 * held / 2**20)))  # room for one such session
    second = _turn("My name is Ada.", tier="turbo-4", tokens=8)[-1][-1]
    assert first.runs == [] and "released while it was idle" in first.evicted and second.runs
    *_, codec_stats, _, _, _, _ = _turn("What is my name?", tier="turbo-4", tokens=8, session=first)[-1]
    assert "caches were released while it was idle" in codec_stats and "prefilled the conversation again" in codec_stats
    assert first.runs[0].prompt_tokens > 20, "the whole conversation was prefilled again"
    assert second.runs == [] and second.evicted, "then the other session was the least recently used"


def test_the_inspect_sliders_follow_the_models_config_and_fall_back_when_it_cannot_be_read(loaded, monkeypatch):
    """The app sizes its sliders from the config alone: it serves before the weights have loaded."""
    assert (app.LAYERS, app.KV_HEADS) == (len(loaded.info.layer_types), loaded.info.num_kv_heads) == (30, 3)

    def unreadable(name):
        raise service.ModelUnavailableError(f"{name}: not installed here")

    monkeypatch.setattr(service, "model_config", unreadable)
    assert service.model_shape("gemma3-270m") == (1, 1)


def test_a_chat_turn_resolves_its_tier_at_the_edge():
    """From app.chat_turn's tier name to the caches, as_tier is entered at most twice: the edge resolves the name
    once, and the cache, its layers and the calibration take the Tier (design: a tier resolved once)."""
    from codeckv.tiers import as_tier

    entered = []

    def count(frame, event, arg):
        if event == "call" and frame.f_code is as_tier.__code__:
            entered.append(frame.f_back.f_code.co_name)

    for tier in ("turbo-4", "pca-8x"):
        entered.clear()
        sys.setprofile(count)
        try:
            updates = _turn("Name a colour.", tier=tier, tokens=4)
        finally:
            sys.setprofile(None)
        assert updates[-1][1][-1]["content"], f"{tier}: the turn answered"
        assert len(entered) <= 2, f"{tier}: as_tier entered from {entered}"


def test_the_tier_picker_timer_stops_once_nothing_is_prepared(monkeypatch):
    monkeypatch.setattr(app, "preparation_text", lambda: "Preparing in the background: pca-8x: calibrating, 40%")
    info, timer = app.tier_picker_info()
    assert "calibrating, 40%" in info["info"] and timer.active, "while a tier is prepared, the picker says so"
    monkeypatch.setattr(app, "preparation_text", lambda: "")
    info, timer = app.tier_picker_info()
    assert info["info"] == app.TIER_INFO and not timer.active, "then the timer stops: no poll per tab forever"


class _StillPreparing:
    """Background preparation caught mid-calibration: a request may read how far it is, but must not wait."""

    def not_ready(self, loaded, tier):
        return f"{tier.name}: calibrating, 40%"

    def wait_for(self, loaded, tier):
        raise AssertionError(f"a short {tier.name} turn waited for its calibration")


def test_a_short_pca_chat_answers_without_its_calibration_and_says_it_is_being_prepared(tmp_path, monkeypatch):
    """A fresh Space: pca-8x not calibrated yet. A short turn holds its tokens raw, which needs no calibration: it
    answers without waiting, says why, and computes none in front of the visitor; downloading its cache waits."""
    monkeypatch.setattr(calibration, "calibration_dir", lambda: tmp_path / "calibration")
    monkeypatch.setattr(calibration, "_LOADED", {})
    monkeypatch.setattr(calibration, "_BASES", {})
    monkeypatch.setattr(service, "PREPARATION", _StillPreparing())
    updates = _turn("What is the capital of France?", tier="pca-8x", tokens=8)
    _, codec, _, codec_stats, *_, session = updates[-1]
    assert any("pca-8x is still being prepared (pca-8x: calibrating, 40%); this turn holds its tokens raw" in u[3]
               for u in updates), [u[3] for u in updates[:3]]
    assert "Paris" in codec[-1]["content"] and "raw until 2,048 tokens" in codec_stats, codec_stats
    layers = [layer for layer in session.runs[1].cache.layers if isinstance(layer, PCALayer)]
    assert layers and all(layer._coder is None for layer in layers), "no layer needed its coder"
    assert not (tmp_path / "calibration").exists(), "nothing computed in front of the visitor"
    with app.POOL.lease("smollm2-135m") as loaded:
        with pytest.raises(ValueError, match="pca-8x is still being prepared .*: download the cache once it is ready"):
            service.chat_download(loaded, session, tmp_path)


def test_a_pca_turn_waits_for_its_calibration_only_when_its_cache_may_archive(loaded):
    limits, session, tier = service.Limits(), ChatSession(), TIERS["pca-8x"]
    prompt = service.prompt_ids(loaded, session.messages("Hi."), 0).shape[1]
    holds = tokens_before_coder(tier)
    assert not service.may_archive(loaded, session, "Hi.", tier, holds - prompt, limits), "raw to the end"
    assert service.may_archive(loaded, session, "Hi.", tier, holds - prompt + 1, limits), "one more may archive"
    assert service.may_archive(loaded, session, "Hi.", TIERS["turbo-4"], 8, limits), "no calibration: nothing to wait"


def test_long_context_tab_runs_a_small_ruler_grid():
    heatmap, chart, table, path, grid = long_context_tab.run_ruler(["niah_single_1"], [1024], 1,
                                                                   ["turbo-4", "snapkv-50"], "smollm2-135m",
                                                                   progress=lambda *a, **k: None)
    assert [row[3] for row in table["data"]] == ["turbo-4", "snapkv-50", "native"]
    assert table["data"][-1][5] == 100.0, "the embedded model finds one number in 1k tokens of noise"
    assert len(heatmap.data) == 1 and len(chart.data) >= 2 and path.endswith("ruler.csv")
    # the grid kept for the Tier sweep: its long-context quality axis charts these scores, sweep or no sweep
    assert grid["model"] == "smollm2-135m" and [r["tier"] for r in grid["rows"]] == ["turbo-4", "snapkv-50", "native"]
    pareto = sweep_tab.sweep_pareto(None, service.LONG_CONTEXT_AXIS, grid)
    points = {name: y for trace in pareto.data if trace.mode == "markers" for name, y in zip(trace.text, trace.y)}
    assert points == {r["tier"]: r["score"] for r in grid["rows"]}
    assert pareto.layout.yaxis.title.text == "RULER average (0-100)" and "smollm2-135m" in pareto.layout.title.text
    empty = sweep_tab.sweep_pareto(None, service.LONG_CONTEXT_AXIS, None)
    assert "run one in the Long context tab" in empty.layout.annotations[0].text and not empty.data
    with pytest.raises(gr.Error, match="at least one task"):
        long_context_tab.run_ruler([], [1024], 1, ["turbo-4"], "smollm2-135m", progress=lambda *a, **k: None)
    with pytest.raises(gr.Error, match="length='100' is not a choice"):
        long_context_tab.run_ruler(["vt"], [100], 1, ["turbo-4"], "smollm2-135m", progress=lambda *a, **k: None)
    with pytest.raises(gr.Error, match="more than the 32,768 allowed"):
        long_context_tab.run_ruler(["vt", "cwe"], [16384], 2, ["turbo-4"], "smollm2-135m",
                                   progress=lambda *a, **k: None)
    with pytest.raises(gr.Error, match="16,384 tokens is more than smollm2-135m takes"):
        long_context_tab.run_ruler(["vt"], [16384], 1, ["turbo-4"], "smollm2-135m", progress=lambda *a, **k: None)


def test_reasoning_tab_runs_a_small_grid_and_refuses_bad_input_before_any_model_work():
    accuracy, curve, table, path = reasoning_tab.run_reasoning(2, ["2"], 32, ["turbo-3-skip2"], "smollm2-135m",
                                                               progress=lambda *a, **k: None)
    assert [row[0] for row in table["data"]] == ["turbo-3-skip2", "native"] and path.endswith(".csv")
    assert all(row[1] == 2 for row in table["data"]) and table["data"][-1][4] == 100.0  # native agrees with itself
    assert "smollm2-135m" in accuracy.layout.title.text and [t.name for t in curve.data] == ["turbo-3-skip2"]
    never = lambda *a, **k: pytest.fail("a refused request reached the model")  # noqa: E731
    for args, message in [
        ((-1, ["2"], 32, ["turbo-3"]), "problems"),
        ((2, ["2"], 100_000, ["turbo-3"]), "reply budget"),
        ((2, [], 32, ["turbo-3"]), "at least one step count"),
        ((2, ["12"], 32, ["turbo-3"]), "steps"),
        ((32, ["2"], 512, ["turbo-3"]), "more than the 2,048 allowed"),
        ((2, ["2"], 32, ["no-such-tier"]), "no-such-tier"),
    ]:
        with pytest.raises(gr.Error, match=message):
            reasoning_tab.run_reasoning(*args, "smollm2-135m", progress=never)
