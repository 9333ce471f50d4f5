"""A hostile caller through the public API of the launched app: every request is refused or bounded, the app
keeps serving, a slow model load holds nobody up, and a long chat costs each turn its new tokens only."""

import re
import threading
import time

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

import tabs.sweep as sweep_tab

PLAIN = [False, 8, 0, "4", "same", 32, True, 0, 0, ""]


@pytest.fixture(scope="module")
def client(app_url):
    return Client(app_url, verbose=False)


def _chat(client, message, model="smollm2-135m", advanced=PLAIN, tokens=8, tier="png"):
    return client.predict(message, None, None, model, tier, tokens, False, *advanced, api_name="/chat")


@pytest.mark.parametrize("model", ["/etc", "/work", "../../etc/passwd", "someone/unlisted-model", "smollm2-135m "])
def test_unlisted_models_are_refused_without_calling_the_loader(client, model):
    """The model dropdown accepts only its choices (Gradio refuses the rest), and the pool checks again."""
    for call in (lambda: client.predict(model, api_name="/model_panel"), lambda: _chat(client, "hi", model=model)):
        with pytest.raises(Exception) as info:
            call()
        message = str(info.value)
        assert "smollm2-135m" in message and "fake/slow-model" in message, "the refusal lists what is allowed"
        assert "loader was called" not in message and "exist" not in message, message


@pytest.mark.parametrize(
    "advanced, expected",
    [
        ([True, 10**6, 1, "4", "same", 32, True, 0, 0, ""], "DCT block size=1000000 is out of range"),
        ([True, 8, 0, "4", "same", 32, True, 10**9, 0, ""], "keep_first=1000000000 is out of range"),
        ([True, 8, 0, "4", "same", 32, True, 4000, 4192, ""], "leave nothing to archive"),
    ],
)
def test_impossible_custom_tiers_are_refused_at_once(client, advanced, expected):
    start = time.perf_counter()
    with pytest.raises(Exception, match=re.escape(expected)):
        _chat(client, "hi", advanced=advanced)
    with pytest.raises(Exception, match=re.escape(expected)):
        client.predict("Some text.", "smollm2-135m", "png", *advanced, 0, 0, "K", api_name="/inspect")
    assert time.perf_counter() - start < 30, "a refusal must not run the model"


def test_long_inspect_text_and_bad_prompts_are_refused(client):
    with pytest.raises(Exception, match="more than the 2,048 allowed"):
        client.predict("word " * 3000, "smollm2-135m", "jpeg-k2", *PLAIN, 0, 0, "K", api_name="/inspect")
    with pytest.raises(Exception, match="empty"):
        _chat(client, "\u200b\u200b")
    with pytest.raises(Exception, match="not in the list of choices"):  # the radio button's own check
        client.predict(sweep_tab.LONG_TEXT, "/etc/passwd", "", None, 1, 128, "", 8, "smollm2-135m", ["png"],
                       "KL divergence", api_name="/sweep")
    native, *_ = _chat(client, "What is the capital of France?", tokens=12)
    assert "Paris" in str(native[-1]), "the app keeps serving"


def test_a_slow_model_load_does_not_hold_up_users_of_a_loaded_model(client):
    def load_the_slow_model():
        with pytest.raises(AppError, match="only takes time to load"):
            Client(client.src, verbose=False).predict("fake/slow-model", api_name="/model_panel")

    started = time.perf_counter()
    loading = threading.Thread(target=load_the_slow_model, daemon=True)
    loading.start()
    time.sleep(2)  # the fake load (40 s) is under way
    native, *_ = _chat(client, "What is the capital of France?", tokens=12)
    answered = time.perf_counter() - started
    assert "Paris" in str(native[-1])
    assert loading.is_alive(), f"the chat ({answered:.1f} s) must not have waited for the 40 s load"


def test_ten_turns_each_prefill_only_their_new_tokens(client):
    conversation = Client(client.src, verbose=False)  # one session: its caches live across turns
    prefilled = []
    for turn in range(10):
        _, _, native_stats, *_ = _chat(conversation, f"Say the number {turn}.", tokens=8)
        prefilled.append(int(re.search(r"prefill of ([\d,]+) new tokens", native_stats).group(1).replace(",", "")))
    assert prefilled[0] > 20 and max(prefilled[1:]) < 30, prefilled
