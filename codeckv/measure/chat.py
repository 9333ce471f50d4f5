"""A chat compared turn by turn: both caches live across turns and each turn prefills only its new tokens.

    session = ChatSession()
    for update in session.ask(loaded, "What is a KV cache?", "turbo-4", max_new_tokens=96):
        show(update.native.text, update.codec.text)
    session.exchanges                  # every finished turn: the user's message, the native and codec replies
    session.rest()                     # between turns: hold both caches at rest; the bytes they hold
    session.release()                  # drop both caches (Clear, or the browser tab closed)

The conversation continues with the native replies, so both caches always see the same conversation.
Every turn renders it with the chat template and prefills only the tokens after the longest common
prefix with what the caches hold: both hold the prompts and the native replies (measure/side_by_side.py
feeds the native reply into the codec cache after its own), so turn N costs its new tokens, not the
whole conversation again. Another model, tier or setting, or a turn that did not finish (stopped,
failed), starts again from empty caches, and so does a session whose idle caches were evicted to keep
the memory of all idle sessions bounded (codeckv/sessions.py): `notice` then says why.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from codeckv.cache import CodecCache, held_bytes
from codeckv.generate import stop_token_ids
from codeckv.measure.runs import NATIVE, Update
from codeckv.measure.side_by_side import Run, prompt_ids, rewind, stream_turn
from codeckv.models import LoadedModel
from codeckv.tiers import Tier, as_tier, get_tier


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Exchange:
    """One finished turn."""

    user: str  # what the model read (a document included)
    shown: str  # how the chat shows the user's message (a document as a one-line note)
    native: str  # the native reply: the conversation goes on with it
    codec: str  # the codec cache's own reply


class ChatSession:
    """The native and codec caches of one conversation, the tokens they hold, and the exchanges so far."""

    def __init__(self) -> None:
        self.exchanges: list[Exchange] = []
        self.setup: tuple | None = None  # (model, tier, materialization_free) the caches were built for
        self.runs: list[Run] = []
        self.held: list[int] = []  # token ids every cache holds
        self.last: Update | None = None  # the latest streamed state of the current turn
        self.asking: tuple[str, str] | None = None  # (user, shown) of the turn in progress
        self.in_turn = False
        self.evicted: str | None = None  # why the caches were released while idle (the next turn re-prefills)
        self.notice: str | None = None  # what the current turn's stats should say about the session's caches
        self.restore_seconds = 0.0  # the current turn's rebuild of the decoded view from the archive (0: none)

    def rest(self) -> int:
        """Between turns: hold each codec cache at rest (archive and raw tokens, no decoded view); the bytes held."""
        for run in self.runs:
            if isinstance(run.cache, CodecCache):
                run.cache.compact()
        return sum(held_bytes(run.cache) for run in self.runs)

    def evict(self, why: str) -> None:
        """Release both caches of this idle session to free memory; its next turn prefills again and says `why`."""
        self.release()
        self.evicted = why

    def release(self) -> None:
        """Drop both caches (the exchanges stay: the next turn prefills the conversation again)."""
        self.setup, self.runs, self.held, self.in_turn = None, [], [], False

    def clear(self) -> None:
        """Forget the conversation and drop both caches."""
        self.release()
        self.exchanges, self.last = [], None

    def messages(self, user: str | None = None) -> list[dict]:
        """The conversation as chat messages (native replies), plus a new user message if given."""
        out = []
        for exchange in self.exchanges:
            out += [{"role": "user", "content": exchange.user}, {"role": "assistant", "content": exchange.native}]
        return out + ([{"role": "user", "content": user}] if user is not None else [])

    def stop(self) -> Update | None:
        """End the current turn where it is: keep what both sides had generated; the caches start over.

        Returns the turn's last streamed state (what had been measured), None when no turn was running.
        """
        last = self.last if self.in_turn else None
        if last is not None and self.asking is not None:
            self.exchanges.append(Exchange(*self.asking, last.native.text, last.codec.text))
        self.release()
        self.last = self.asking = None
        return last

    def ask(self, loaded: LoadedModel, user: str, tier: Tier | str, max_new_tokens: int = 96,
            materialization_free: bool | None = None, shown: str | None = None,
            max_prompt_tokens: int | None = None) -> Iterator[Update]:
        """One turn: `user` after the conversation so far; the exchange is kept when the turn finishes."""
        self.asking, update = (user, shown or user), None
        turn = self.turn(loaded, self.messages(user), tier, max_new_tokens, materialization_free,
                         max_prompt_tokens=max_prompt_tokens)
        for update in turn:
            yield update
        if update is not None and update.results is not None and not self.in_turn:  # finished, not stopped
            self.exchanges.append(Exchange(*self.asking, update.native.text, update.codec.text))
            self.asking = None

    def turn(
        self,
        loaded: LoadedModel,
        messages: list[dict],
        tier: Tier | str,
        max_new_tokens: int = 96,
        materialization_free: bool | None = None,
        stop_at_eos: bool = True,
        max_prompt_tokens: int | None = None,
    ) -> Iterator[Update]:
        """One turn on `messages` (the whole conversation, ending with the user's message), streamed."""
        tier = as_tier(tier)
        ids = prompt_ids(loaded, messages, max_new_tokens, max_prompt_tokens)
        setup = (loaded.info.name, tier, materialization_free)
        self.notice, self.evicted = self.evicted, None
        if setup != self.setup or self.in_turn:
            self.release()
            self.setup = setup
            self.runs = [Run(loaded, NATIVE, get_tier(NATIVE)), Run(loaded, tier.name, tier, materialization_free)]
        self.restore_seconds = sum(r.cache.restore() for r in self.runs if isinstance(r.cache, CodecCache))
        keep = min(common_prefix(self.held, ids[0].tolist()), ids.shape[1] - 1)  # always prefill a token
        for run in self.runs:
            rewind(loaded, run, ids, keep)
        stops = stop_token_ids(loaded.tokenizer, loaded.model) if stop_at_eos else frozenset()
        self.in_turn, runs = True, self.runs
        for update in stream_turn(loaded, runs, ids, max_new_tokens, stops):
            if runs is not self.runs:  # stopped (release) while this turn was computing
                return
            self.last = update
            yield update
        self.held = ids[0].tolist() + runs[0].token_ids[:-1]  # the last reply token is not fed yet
        self.in_turn = False
