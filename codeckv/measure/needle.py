"""Needle (pass key) retrieval per tier: a 5-digit key hidden at a depth of filler text of a given length.

    grid = needle_grid(loaded, ["turbo-4", "jpeg-k2"], lengths=[1024, 4096], depths=[0.0, 0.5, 1.0])
    grid.rows       # NeedleRow per (tier, length, depth): retrieved or not, and the answer

The prompt (one user turn through the chat template) asks for a pass key hidden in repetitive filler,
as in the pass-key retrieval test of Mohtashami & Jaggi (2023): an instruction, filler sentences with
the key sentence inserted after `depth` of them, then the question. `length` is the prompt's length
in tokens (within one filler sentence). Each (length, depth) is prefilled once, natively, in chunks;
every tier's cache is filled from that native cache (exactly a prefill through the codec cache,
measure/side_by_side.py) and answers greedily. A press follows its protocol (`press_mode`, codeckv/presses/base.py):
"once" (kvpress's, the default): the context, everything before the question, is prefilled natively in one forward
once per cell and each press's cache is pressed from it (measure/shared_prefill.py), then the question is fed
unpressed; "chunked": the press's cache prefills the prompt itself in PREFILL_CHUNK-token chunks, each pressed as it
arrives. Retrieved = the key appears in the answer. A peer
(codeckv/measure/peers.py) is filled from the same native cache in one update per layer, as a one-forward
prefill through it would be; a peer that cannot run here gets a line in `absent` instead of its rows,
and a cell where the peer itself fails (HQQ's 4-bit packing cannot hold an odd number of groups: batch x
KV heads x tokens odd) is a row with its `error`, not retrieved. llama.cpp's KV types (measure/llamacpp.py) answer
in llama.cpp from the same prompt ids, beside llama.cpp's own f16 cache (its row `llamacpp-f16`), one engine per
type for the whole grid.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field

import torch
from transformers import DynamicCache

from codeckv.cache import footprint, make_cache
from codeckv.loaded import LoadedModel
from codeckv.measure.generate import chat_input_ids, next_logits, stop_token_ids
from codeckv.measure.llamacpp import (
    LLAMACPP_REFERENCE,
    KVGeometry,
    LlamaCppPeer,
    open_engine,
    rule_bytes_per_token,
)
from codeckv.measure.peers import Peer, absent_reason, filled_peer_cache, peer_footprint
from codeckv.measure.shared_prefill import shared_prefill
from codeckv.measure.side_by_side import PREFILL_CHUNK, Run, filled_from
from codeckv.presses import Budget, check_press_mode
from codeckv.tiers import TIERS, Tier

INTRO = ("There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the pass key.\n\n")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "\n\nWhat is the pass key?"
ANSWER_TOKENS = 16
Progress = Callable[[int, int, str], None]  # (cells done, cells in all, message); may raise to stop


@dataclass
class NeedleRow:
    tier: str
    length: int  # prompt tokens asked for
    tokens: int  # prompt tokens built
    depth: float  # where the key sits in the filler: 0 = first, 1 = last
    key: str
    retrieved: bool
    answer: str
    ratio_vs_bf16: float  # the tier's cache holding the prompt
    error: str = ""  # a peer that failed on this cell: its message (then not retrieved)
    press_mode: str = ""  # a press's protocol, "once" or "chunked"; "" for a tier without a press


@dataclass
class NeedleGrid:
    rows: list[NeedleRow]
    tiers: list[str]  # "native" first
    lengths: list[int]
    depths: list[float]
    absent: list[str] = field(default_factory=list)  # one line per peer asked for that cannot run here

    def retrieved(self, tier: str) -> torch.Tensor:
        """(depths, lengths) 1.0 where `tier` retrieved the key."""
        grid = torch.zeros(len(self.depths), len(self.lengths))
        for row in self.rows:
            if row.tier == tier:
                grid[self.depths.index(row.depth), self.lengths.index(row.length)] = float(row.retrieved)
        return grid


def needle_key(length: int, depth: float) -> str:
    """A fixed 5-digit key per cell, so runs are repeatable and cells differ."""
    return str(random.Random(f"{length}:{depth}").randrange(10_000, 100_000))


def question_start(loaded: LoadedModel, ids: torch.Tensor) -> int:
    """Where the question begins in a needle prompt's ids (1, T): the context before it is what a press evicts from."""
    text = loaded.tokenizer.decode(ids[0])
    head = text[: text.rindex(QUESTION)]
    context = loaded.tokenizer(head, add_special_tokens=False, return_tensors="pt").input_ids[0].to(ids.device)
    common = int((ids[0, : context.shape[0]] == context[: ids.shape[1]]).cumprod(0).sum())
    return max(1, min(common, ids.shape[1] - 1))


def needle_prompt(loaded: LoadedModel, length: int, depth: float, key: str) -> torch.Tensor:
    """(1, T) ids of the chat prompt with the key at `depth` of the filler, T within one filler sentence of length."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth={depth} must be in [0, 1]")

    def build(units: int) -> torch.Tensor:
        at = round(depth * units)
        haystack = FILLER * at + NEEDLE.format(key=key) + FILLER * (units - at)
        message = [{"role": "user", "content": INTRO + haystack + QUESTION}]
        return chat_input_ids(loaded.tokenizer, message, loaded.model.device)

    bare = build(0).shape[1]
    per_unit = (build(8).shape[1] - bare) / 8
    if length < bare + per_unit:
        raise ValueError(f"length={length} is too short: the instruction and the key alone take {bare} tokens")
    return build(int((length - bare) / per_unit))


@torch.inference_mode()
def _answer(loaded: LoadedModel, cache, first: torch.Tensor, stop_ids) -> str:
    """Greedy answer from a cache holding the prompt, whose prefill predicted `first` (logits)."""
    tokens = [int(first.argmax())]
    while tokens[-1] not in stop_ids and len(tokens) < ANSWER_TOKENS:
        logits = next_logits(loaded.model, torch.tensor([[tokens[-1]]], device=loaded.model.device), cache)
        tokens.append(int(logits[0].argmax()))
    return loaded.tokenizer.decode(tokens, skip_special_tokens=True)


def check_lengths(model: str, max_context: int, lengths: list[int]) -> None:
    """A ValueError for a prompt length whose answer would not fit a model of `max_context` tokens (the CLI asks
    before loading the model, from its config)."""
    if max(lengths) + ANSWER_TOKENS > max_context:
        raise ValueError(f"length {max(lengths)} + {ANSWER_TOKENS} answer tokens exceeds {model}'s context of "
                         f"{max_context} tokens")


def needle_tiers(loaded: LoadedModel, tiers: list[Tier | Peer | LlamaCppPeer], press_mode: str
                 ) -> tuple[list, list, list[str]]:
    """(torch tiers with native first, llama.cpp types with its f16 first or none, a line per peer that cannot run
    here, left out)."""
    check_press_mode(press_mode)
    tiers = [TIERS["native"]] + [t for t in tiers if not t.is_native]
    reasons = {t.name: absent_reason(t, loaded.info) for t in tiers if isinstance(t, Peer | LlamaCppPeer)}
    tiers = [t for t in tiers if not reasons.get(t.name)]
    llama = [t for t in tiers if isinstance(t, LlamaCppPeer)]
    llama = list(dict.fromkeys([LLAMACPP_REFERENCE, *llama])) if llama else []
    return [t for t in tiers if not isinstance(t, LlamaCppPeer)], llama, [r for r in reasons.values() if r]


def open_needle_engines(stack, loaded: LoadedModel, llama: list, longest: int) -> dict:
    """llama.cpp's engine per type for prompts up to `longest` tokens, on torch's threads, closed with `stack`."""
    return {t.name: stack.enter_context(open_engine(t, loaded.info.name, n_ctx=longest,
                                                    n_threads=torch.get_num_threads())) for t in llama}


def needle_cell(loaded: LoadedModel, tiers: list, llama: list, engines: dict, length: int, depth: float,
                press_mode: str = "once") -> list[NeedleRow]:
    """One (length, depth): the prompt prefilled natively once, every torch tier answering from it (a press under
    `press_mode`), then llama.cpp's types in `engines` from the same ids; a row per tier."""
    key = needle_key(length, depth)
    ids = needle_prompt(loaded, length, depth, key)
    stop_ids = stop_token_ids(loaded.tokenizer, loaded.model)
    native = DynamicCache(config=loaded.model.config)
    with torch.inference_mode():
        for lo in range(0, ids.shape[1], PREFILL_CHUNK):
            first = next_logits(loaded.model, ids[:, lo : lo + PREFILL_CHUNK], native)[0]
    context = None  # the context prefilled once for every press (press_mode "once"), when one needs it
    rows = []
    for tier in tiers[::-1]:  # native last: answering extends the cache the others are filled from
        if isinstance(tier, Peer):
            try:
                cache = filled_peer_cache(native, loaded, tier)
                ratio = peer_footprint(cache).ratio
                answer = _answer(loaded, cache, first, stop_ids)
            except RuntimeError as err:  # the peer's own failure on this prompt, kept as its row
                rows.append(NeedleRow(tier.name, length, ids.shape[1], depth, key, False, "", math.nan,
                                      str(err).splitlines()[0]))
                continue
        elif tier.evicts and press_mode == "once" and not isinstance(tier.press, Budget):
            context = context or shared_prefill(loaded, ids[:, : question_start(loaded, ids)])
            cache = context.cache_for(tier)
            with torch.inference_mode():  # the question, not pressed
                own = next_logits(loaded.model, ids[:, context.ids.shape[1] :], cache)[0]
            ratio = footprint(cache).ratio
            answer = _answer(loaded, cache, own, stop_ids)
        elif tier.evicts:  # chunked (or a token budget): the cache prefills itself, pressing as it goes
            cache, own = make_cache(loaded, tier, press_mode="chunked"), None
            with torch.inference_mode():
                for lo in range(0, ids.shape[1], PREFILL_CHUNK):
                    own = next_logits(loaded.model, ids[:, lo : lo + PREFILL_CHUNK], cache)[0]
            ratio = footprint(cache).ratio
            answer = _answer(loaded, cache, own, stop_ids)
        else:
            cache = native if tier.is_native else filled_from(native, Run(loaded, tier.name, tier))
            ratio = footprint(cache).ratio
            answer = _answer(loaded, cache, first, stop_ids)
        evicts = getattr(tier, "evicts", False)  # a peer has no press
        mode = (press_mode if not isinstance(tier.press, Budget) else "budget") if evicts else ""
        rows.append(NeedleRow(tier.name, length, ids.shape[1], depth, key, key in answer, answer, ratio,
                              press_mode=mode))
    if llama:
        geometry = KVGeometry(len(loaded.info.layer_types), loaded.info.num_kv_heads, loaded.info.head_dim)
        for peer in llama:
            ratio = rule_bytes_per_token(peer, geometry) / rule_bytes_per_token(LLAMACPP_REFERENCE, geometry)
            answer = engines[peer.name].greedy(ids[0].tolist(), ANSWER_TOKENS).text
            rows.append(NeedleRow(peer.name, length, ids.shape[1], depth, key, key in answer, answer, ratio))
    return rows


def needle_grid(
    loaded: LoadedModel,
    tiers: list[Tier | Peer | LlamaCppPeer],
    lengths: list[int],
    depths: list[float],
    progress: Progress | None = None,
    press_mode: str = "once",
) -> NeedleGrid:
    """Native and every tier or peer on every (length, depth), in this process: retrieved or not; presses under
    `press_mode`. The CLI runs the same cells on the grid runner (needle_job.py)."""
    torch_tiers, llama, absent = needle_tiers(loaded, tiers, press_mode)
    check_lengths(loaded.info.name, loaded.info.max_context, lengths)
    rows, cells = [], [(length, depth) for length in lengths for depth in depths]
    with ExitStack() as stack:
        engines = open_needle_engines(stack, loaded, llama, max(lengths) + ANSWER_TOKENS)
        for done, (length, depth) in enumerate(cells, 1):
            rows += needle_cell(loaded, torch_tiers, llama, engines, length, depth, press_mode)
            if progress:
                progress(done, len(cells), f"{length} tokens, depth {depth:g}")
    return needle_result(rows, [t.name for t in torch_tiers + llama], lengths, depths, absent)


def needle_result(rows: list[NeedleRow], tiers: list[str], lengths: list[int], depths: list[float],
                  absent: list[str] = ()) -> NeedleGrid:
    """The grid of `rows`, sorted tier by tier (native first), then by length and depth."""
    order = {name: i for i, name in enumerate(tiers)}
    rows = sorted(rows, key=lambda r: (order[r.tier], r.length, r.depth))
    return NeedleGrid(rows, list(tiers), list(lengths), list(depths), list(absent))


def needle_row(row: dict) -> NeedleRow:
    """A NeedleRow from its columns, fresh or read back from a CSV as text (a grid's rows are either)."""
    text = {column: str(row[column]) for column in NeedleRow.__dataclass_fields__}
    return NeedleRow(text["tier"], int(text["length"]), int(text["tokens"]), float(text["depth"]), text["key"],
                     text["retrieved"] == "True", text["answer"], float(text["ratio_vs_bf16"]), text["error"],
                     text["press_mode"])


def as_dicts(rows: list[NeedleRow]) -> list[dict]:
    return [asdict(r) for r in rows]
