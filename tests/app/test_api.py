"""The launched app driven through its API with gradio_client: a chat turn, a sweep, concurrent users."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from gradio_client import Client

import tabs.sweep as sweep_tab

PLAIN = [False, 8, 0, "4", "same", 32, True, 0, 0, ""]


@pytest.fixture(scope="module")
def client(app_url):
    return Client(app_url, verbose=False)


def _text(message) -> str:
    """A chat message's content as text (the API returns a list of typed parts)."""
    content = message["content"]
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content)


def _chat(client, message, tokens=8, tier="png"):
    return client.predict(message, None, None, "smollm2-135m", tier, tokens, False, *PLAIN, api_name="/chat")


def test_chat_turn_over_the_api(client):
    native, codec, native_stats, codec_stats, *_ = _chat(client, "What is the capital of France?", tokens=12)
    assert "Paris" in _text(native[-1])
    assert "token match **100%**" in codec_stats and "KL divergence **0.0000**" in codec_stats


def test_two_tier_sweeps_over_the_api(client):
    source = next(iter(sweep_tab.SOURCES))
    table, *_ = client.predict(sweep_tab.LONG_TEXT, source, "", None, 1, 128, "", 8, "smollm2-135m",
                               ["png", "jpeg-k8-int8"], "KL divergence", api_name="/sweep")
    assert [row[0] for row in table["data"]] == ["native", "png", "jpeg-k8-int8"]
    table, *_ = client.predict(sweep_tab.ONE_PROMPT, source, "", None, 1, 128, "Say hello.", 8, "smollm2-135m",
                               ["png"], "KL divergence", api_name="/sweep")
    assert [row[0] for row in table["data"]] == ["png"]


def test_four_concurrent_chats_are_all_answered(client):
    questions = ["What is 2 + 2?", "Name a fruit.", "What colour is the sky?", "Say hi."]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda q: _chat(Client(client.src, verbose=False), q, tier="turbo-4"), questions))
    for native, codec, _, codec_stats, *_ in answers:
        assert _text(native[-1]) and _text(codec[-1])
        assert "token match" in codec_stats


def test_bad_input_over_the_api_is_an_error_and_the_app_keeps_serving(client):
    with pytest.raises(Exception, match="empty"):
        _chat(client, "  ")
    native, *_ = _chat(client, "What is the capital of France?", tokens=12)
    assert "Paris" in _text(native[-1])
