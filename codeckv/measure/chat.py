"""A chat compared turn by turn: both caches live across turns and each turn prefills only its new tokens.

    session = ChatSession()
    for update in session.ask(loaded, "What is a KV cache?", "turbo-4", max_new_tokens=96):
        show(update.native.text, update.codec.text)
    session.exchanges                  # every finished turn: the user's message, the native and codec replies
    session.rest()                     # between turns: both caches at rest, no model held; the bytes they hold
    session.release()                  # drop both caches (Clear, or the browser tab closed)
    session.save("chat.kvc", loaded)   # the codec cache and the exchanges, in one file (cache/saved_format.py)
    session.resume(loaded, "chat.kvc") # continue it: the codec cache from the file, the native one re-prefilled

The conversation continues with the native replies, so both caches always see the same conversation.
Every turn renders it with the chat template and prefills only the tokens after the longest common
prefix with what the caches hold: both hold the prompts and the native replies (measure/side_by_side.py
feeds the native reply into the codec cache after its own), so turn N costs its new tokens, not the
whole conversation again. Another model, tier or setting, or a turn that did not finish (stopped,
failed), starts again from empty caches, and so does a session whose idle caches were evicted to keep
the memory of all idle sessions bounded (codeckv/serve/sessions.py): `notice` then says why.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from codeckv.cache import CodecCache, held_bytes
from codeckv.cache.saved_format import MAX_FILE_BYTES, SavedCacheError
from codeckv.cache.saved_load import load_cache
from codeckv.loaded import LoadedModel
from codeckv.measure.generate import next_logits, stop_token_ids
from codeckv.measure.runs import NATIVE, Update
from codeckv.measure.side_by_side import PREFILL_CHUNK, Run, prompt_ids, rewind, stream_turn
from codeckv.tiers import Tier, get_tier


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


@dataclass
class Resumed:
    """What resuming a saved conversation did."""

    tokens: int  # tokens both caches hold now
    file_bytes: int
    load_s: float  # checking and reading the file
    restore_s: float  # rebuilding the codec cache's decoded view from its archive (0 on the codes)
    native_prefill_s: float  # the native cache, re-prefilled from the saved token ids


def exchanges_from(extra) -> list[Exchange]:
    """The exchanges a Chat file keeps in its header's extra ({"chat": [...]}), checked; SavedCacheError if none."""
    chat = extra.get("chat") if isinstance(extra, dict) else None
    names = [f.name for f in fields(Exchange)]
    if not isinstance(chat, list) or not chat or not all(
        isinstance(e, dict) and sorted(e) == sorted(names) and all(isinstance(e[n], str) for n in names) for e in chat
    ):
        raise SavedCacheError("this file holds no Chat conversation (allowed: a cache downloaded from the Chat; "
                              "a library file loads with codeckv.load_cache)")
    return [Exchange(**e) for e in chat]


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
        """Between turns: hold each codec cache at rest (archive and raw tokens, no decoded view) and no model (the
        next turn's, or a save's, is bound then: a model a pool drops meanwhile is freed); the bytes held."""
        for run in self.runs:
            if isinstance(run.cache, CodecCache):
                run.cache.compact()
            run.bind(None)
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

    def save(self, path: str | Path, loaded: LoadedModel) -> int:
        """Write the codec cache of the conversation and its exchanges to `path` (cache/saved_format.py): the bytes."""
        if self.in_turn or len(self.runs) != 2 or not self.held or not self.exchanges:
            raise ValueError("nothing to save yet: the conversation needs a finished turn first")
        codec = self.runs[1]
        if not isinstance(codec.cache, CodecCache):
            raise ValueError(f"tier '{codec.tier.name}' keeps a native cache: there is no codec cache to save")
        codec.bind(loaded)  # a PCA cache's calibration is read from it (cache/saved_format.py)
        try:
            return codec.cache.save(path, self.held, loaded, extra={"chat": [asdict(e) for e in self.exchanges]})
        finally:
            codec.bind(None)  # idle again

    def resume(self, loaded: LoadedModel, path: str | Path, max_bytes: int = MAX_FILE_BYTES,
               max_tokens: int | None = None) -> Resumed:
        """Continue the conversation saved at `path`: the codec cache from the file (its view rebuilt), the native
        cache re-prefilled from the saved token ids, the exchanges from its header. Nothing changes on an error."""
        start = time.perf_counter()
        saved = load_cache(path, loaded, max_bytes)
        exchanges, ids = exchanges_from(saved.header.get("extra")), saved.token_ids.to(loaded.model.device)
        if ids.shape[0] != 1 or (max_tokens is not None and ids.shape[1] > max_tokens):
            raise SavedCacheError(f"this file holds {ids.shape[0]} x {ids.shape[1]:,} tokens (allowed: one "
                                  f"conversation of at most {max_tokens or loaded.info.max_context:,} tokens)")
        load_s = time.perf_counter() - start
        tier, free = saved.cache.tier, bool(saved.header["materialization_free"])
        restore_s = saved.cache.restore()
        native, codec = Run(loaded, NATIVE, get_tier(NATIVE)), Run(loaded, tier.name, tier, free, raw_until=None)
        start = time.perf_counter()
        with torch.inference_mode():
            for lo in range(0, ids.shape[1], PREFILL_CHUNK):
                next_logits(loaded.model, ids[:, lo : lo + PREFILL_CHUNK], native.cache)
        prefill_s = time.perf_counter() - start
        native.held = codec.held = ids.shape[1]
        codec.cache = saved.cache
        self.clear()
        mode = None if free else False  # what the next turn passes: None = on the codes (the default), False = a view
        self.setup, self.runs, self.exchanges = (loaded.info.name, tier, mode), [native, codec], exchanges
        self.held = ids[0].tolist()
        return Resumed(ids.shape[1], Path(path).stat().st_size, load_s, restore_s, prefill_s)

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

    def ask(self, loaded: LoadedModel, user: str, tier: Tier, max_new_tokens: int = 96,
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
        tier: Tier,
        max_new_tokens: int = 96,
        materialization_free: bool | None = None,
        stop_at_eos: bool = True,
        max_prompt_tokens: int | None = None,
    ) -> Iterator[Update]:
        """One turn on `messages` (the whole conversation, ending with the user's message), streamed."""
        ids = prompt_ids(loaded, messages, max_new_tokens, max_prompt_tokens)
        setup = (loaded.info.name, tier, materialization_free)
        self.notice, self.evicted = self.evicted, None
        if setup != self.setup or self.in_turn:
            self.release()
            self.setup = setup
            self.runs = [Run(loaded, NATIVE, get_tier(NATIVE)),
                         Run(loaded, tier.name, tier, materialization_free, raw_until=None)]  # raw until its N
        for run in self.runs:
            run.bind(loaded)  # caches kept from the last turn: on this turn's model (the same name, maybe reloaded)
        self.restore_seconds = sum(r.cache.restore() for r in self.runs if isinstance(r.cache, CodecCache))
        keep = min(common_prefix(self.held, ids[0].tolist()), ids.shape[1] - 1)  # always prefill a token
        for run in self.runs:
            rewind(loaded, run, ids, keep)
        stops = stop_token_ids(loaded.tokenizer, loaded.model) if stop_at_eos else frozenset()
        self.in_turn, runs = True, self.runs
        for update in stream_turn(loaded, runs, ids, max_new_tokens, stops, follow_own=True):
            if runs is not self.runs:  # stopped (release) while this turn was computing
                return
            self.last = update
            yield update
        self.held = ids[0].tolist() + runs[0].token_ids[:-1]  # the last reply token is not fed yet
        self.in_turn = False
