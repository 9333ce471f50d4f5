"""The Chat's codec cache as a file: download it, resume the conversation from it, and clear errors for bad uploads."""

import shutil

import gradio as gr
import pytest

import app
from codeckv.measure.chat import ChatSession

PLAIN = [False, 8, 0, "4", "same", 32, True, 0, 0, ""]  # Advanced accordion untouched: use the preset


def _turn(message, session=None, tier="turbo-4", tokens=8):
    args = (message, None, None, "smollm2-135m", tier, tokens, False, *PLAIN, session)
    return list(app.chat_turn(*args))[-1]


@pytest.fixture(scope="module")
def conversation(tmp_path_factory):
    """A one-turn turbo-4 conversation and its downloaded cache file."""
    session = _turn("My name is Ada. Say hello.")[-1]
    path = tmp_path_factory.mktemp("kvc") / "conversation.kvc"
    shutil.copy(app.download_cache(session), path)
    return session, path


def test_a_resumed_conversation_continues_exactly_as_the_original(conversation):
    session, path = conversation
    native, codec, native_note, codec_note, tier, view, custom, upload, resumed = app.resume_chat(
        str(path), "smollm2-135m", None)
    assert "Resumed from **conversation.kvc**" in codec_note and "re-prefilled" in native_note
    rebuilt = "decoded view rebuilt in" if view else "attention reads the stored codes"
    assert rebuilt in codec_note and tier == "turbo-4" and custom is False
    assert upload is None and native[0]["content"] == session.exchanges[0].shown, "the exchanges are shown again"
    assert resumed.held == session.held, "both caches hold the saved conversation"
    came_back = _turn("What is my name?", session=resumed)
    went_on = _turn("What is my name?", session=session)
    assert came_back[1][-1] == went_on[1][-1], "the codec reply after a resume is the one without it"
    assert came_back[0][-1] == went_on[0][-1]
    assert resumed.runs[0].prompt_tokens < 30, "the resumed caches are used: only the new turn is prefilled"


def test_bad_uploads_are_refused_and_keep_the_session(conversation, tmp_path, monkeypatch):
    _, path = conversation
    kept = app.resume_chat(str(path), "smollm2-135m", None)[-1]
    exchanges, held = list(kept.exchanges), list(kept.held)
    with pytest.raises(gr.Error, match="upload a codec cache file first"):
        app.resume_chat(None, "smollm2-135m", kept)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(gr.Error, match=r"not a codec cache file \(allowed: .kvc\)"):
        app.resume_chat(str(tmp_path / "notes.txt"), "smollm2-135m", kept)
    (tmp_path / "cut.kvc").write_bytes(path.read_bytes()[:-10])
    with pytest.raises(gr.Error, match="truncated"):
        app.resume_chat(str(tmp_path / "cut.kvc"), "smollm2-135m", kept)
    monkeypatch.setenv("CODECKV_MAX_CACHE_FILE_BYTES", "1000")
    with pytest.raises(gr.Error, match="more than the 1,000 allowed"):
        app.resume_chat(str(path), "smollm2-135m", kept)
    assert kept.exchanges == exchanges and kept.held == held, "a refused upload changes nothing"


def test_nothing_to_download_before_a_turn():
    with pytest.raises(gr.Error, match="nothing to save yet"):
        app.download_cache(ChatSession())
    with pytest.raises(gr.Error, match="nothing to save yet"):
        app.download_cache(None)
