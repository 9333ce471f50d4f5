"""A chat session keeps both caches across turns: each turn prefills its new tokens only, both caches hold the
same conversation, a stop keeps what was generated, and a hybrid model's sliding layers are refilled when a
rewind cannot crop them."""

import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import torch

from codeckv.cache import calibration
from codeckv.cache.calibration import Deferred
from codeckv.loaded import LoadedModel
from codeckv.measure.chat import ChatSession, common_prefix
from codeckv.measure.follower import Follower
from codeckv.measure.generate import next_logits, stop_token_ids
from codeckv.measure.side_by_side import Run, prompt_ids, stream_turn
from codeckv.models import _describe
from codeckv.serve.limits import Limits
from codeckv.tiers import TIERS, get_tier


def _ask(session, loaded, message, tier="turbo-4", tokens=8):
    *_, last = session.ask(loaded, message, TIERS[tier], tokens)
    return last.result


def test_later_turns_prefill_only_their_new_tokens(loaded):
    session = ChatSession()
    first = _ask(session, loaded, "My name is Ada. Please remember it.")
    held_after_first = len(session.held)
    second = _ask(session, loaded, "What is my name?")
    third = _ask(session, loaded, "Spell it backwards.")
    assert first.native.prompt_tokens == first.codec.prompt_tokens > 20
    assert second.native.prompt_tokens < 20 and third.native.prompt_tokens < 20, "only the new turn is prefilled"
    assert len(session.held) > held_after_first
    native, codec = session.runs
    assert native.held == codec.held == len(session.held), "both caches hold the same conversation"
    assert [e.shown for e in session.exchanges] == ["My name is Ada. Please remember it.", "What is my name?",
                                                    "Spell it backwards."]
    assert session.messages()[-1] == {"role": "assistant", "content": third.native.text}


def test_a_new_tier_starts_over_and_a_stop_keeps_the_partial_turn(loaded):
    session = ChatSession()
    _ask(session, loaded, "Name a colour.", tier="png")
    first_runs = session.runs
    updates = session.ask(loaded, "Name another one.", TIERS["turbo-4"], 24)
    for update in updates:
        if update.phase == "generating":
            break
    last = session.stop()
    updates.close()
    assert session.runs != first_runs or session.runs == [], "another tier builds new caches"
    assert last is not None and last.phase == "generating" and session.runs == []
    assert session.exchanges[-1].shown == "Name another one." and session.exchanges[-1].native == last.native.text
    again = _ask(session, loaded, "And a third?")
    assert again.native.prompt_tokens > 20, "after a stop the conversation is prefilled again"


def test_an_idle_session_holds_no_model_and_its_next_turn_runs_on_the_one_it_is_given(loaded, tmp_path, monkeypatch):
    """Between turns a session keeps its caches but no model, so a model the pool drops is freed (also while its PCA
    cache's calibration is still Deferred); the next turn, on the model loaded again, keeps the caches."""
    monkeypatch.setattr(calibration, "calibration_dir", lambda: tmp_path / "calibration")  # pca-8x not ready yet
    monkeypatch.setattr(calibration, "_LOADED", {})
    monkeypatch.setattr(calibration, "_BASES", {})
    first = LoadedModel(loaded.model, loaded.tokenizer, loaded.info)  # what a pool drops: nothing else holds it
    session = ChatSession()
    _ask(session, first, "My name is Ada. Please remember it.", tier="pca-8x", tokens=4)
    assert isinstance(session.runs[1].calibration, Deferred)
    session.rest()
    dropped = weakref.ref(first)
    del first
    gc.collect()
    assert dropped() is None, "the idle session still holds the model it ran on"
    again = LoadedModel(loaded.model, loaded.tokenizer, loaded.info)  # the same name, loaded again
    second = _ask(session, again, "What is my name?", tier="pca-8x", tokens=4)
    assert second.native.prompt_tokens < 20, "the caches of the first turn were kept"
    assert all(run.loaded is again for run in session.runs) and session.runs[1].calibration.loaded is again


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0


def test_hybrid_sliding_layers_are_refilled_when_the_codec_cache_rewinds(tiny_gemma3, loaded):
    tiny = LoadedModel(tiny_gemma3, loaded.tokenizer, _describe("tiny-gemma3", "test", tiny_gemma3, 0.0))
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(0))  # past the 16-token window
    runs = [Run(tiny, "native", get_tier("native")), Run(tiny, "png", get_tier("png"))]
    *_, last = stream_turn(tiny, runs, ids, 8, frozenset())
    result = last.result
    assert result.kld == 0.0 and result.top1_pct == 100.0 and result.token_match == 1.0, "png on a hybrid is exact"
    assert runs[1].held == runs[0].held == 40 + 7


def test_the_largest_allowed_chat_turn_stays_within_its_memory_bound():
    """A prompt at the app's token limit, png (the largest codec view), in a fresh process: peak RSS growth
    stays under 2.5 GiB (measured 2.0 GiB with 64 new tokens: two fp32 caches and their views of 8k tokens,
    one prefill chunk)."""
    script = Path(__file__).with_name("max_request.py")
    env = {**os.environ, "PYTHONPATH": str(script.parents[2])}
    done = subprocess.run([sys.executable, str(script), "png", "8"], capture_output=True, text=True, env=env,
                          timeout=600, check=True)
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert measured["prompt_tokens"] > Limits().max_prompt_tokens - 300
    assert measured["peak_growth_mib"] < 2.5 * 1024, measured


def test_a_turn_scores_the_codec_along_its_own_reply_as_well_as_along_natives(loaded):
    """Native fed the codec's own tokens (measure/follower.py): one KLD per position of the codec's reply; where
    the two replies agree token for token, the same positions as the native reply's scoring, so the same KLD within
    the rounding of two code paths; a lossless tier scores 0."""
    session = ChatSession()
    lossy = _ask(session, loaded, "Name three colours of the rainbow.", tier="turbo-3", tokens=16)
    assert len(lossy.own_token_kld) == len(lossy.codec.token_ids)
    assert lossy.own_kld == sum(lossy.own_token_kld) / len(lossy.own_token_kld) and 0 <= lossy.own_top1_pct <= 100
    same = lossy.first_divergence if lossy.first_divergence is not None else len(lossy.codec.token_ids)
    for own, on_native in zip(lossy.own_token_kld[:same], lossy.token_kld[:same]):
        assert abs(own - on_native) <= max(0.05 * on_native, 1e-4)
    lossless = _ask(ChatSession(), loaded, "Name three colours of the rainbow.", tier="png", tokens=16)
    assert lossless.own_kld < 1e-5 and lossless.own_top1_pct == 100.0


def test_the_follower_feeds_native_only_where_the_replies_part(loaded, monkeypatch):
    """Where the codec's reply is native's token for token, native's own log-probs stand for the follower's (the same
    tokens on the same cache): the scores are those of a follower that feeds every token, within the rounding of one
    forward over the agreed tokens against one per token, and a lossless tier's follower feeds nothing. The codecs
    archive from their first unit (a Chat holds a prompt this short raw)."""
    ids = prompt_ids(loaded, [{"role": "user", "content": "Name three colours of the rainbow."}])
    stops = stop_token_ids(loaded.tokenizer, loaded.model)
    held = []
    real_scores = Follower.scores
    monkeypatch.setattr(Follower, "scores", lambda self: held.append(self.held) or real_scores(self))

    def own_scores(tier: str):
        runs = [Run(loaded, "native", get_tier("native")), Run(loaded, tier, get_tier(tier))]
        *_, last = stream_turn(loaded, runs, ids, 16, stops, follow_own=True)
        return last.result

    lossless, lazy = own_scores("png"), own_scores("jpeg-k2")
    assert len(held) == 2 and held[0] == 0 and lossless.own_kld == 0.0, "png's reply is native's: nothing fed"
    assert lazy.first_divergence is not None and held[1] > 0, "jpeg-k2's reply parts from native's"

    def feed_every_token(self, ids):  # the follower before the shortcut
        self.fed.append(int(ids.reshape(-1)[0]))
        self.pending = torch.log_softmax(next_logits(self.loaded.model, ids, self.cache)[0], dim=-1).cpu()
        self.held = len(self.fed)

    monkeypatch.setattr(Follower, "feed", feed_every_token)
    eager = own_scores("jpeg-k2")
    assert eager.codec.token_ids == lazy.codec.token_ids and 0 < lazy.first_divergence
    for position, (a, b) in enumerate(zip(lazy.own_token_kld, eager.own_token_kld, strict=True)):
        assert abs(a - b) <= max(1e-3 * b, 1e-6), (position, a, b)
