"""Measurements of llama.cpp's KV-cache types (codeckv/measure/llamacpp.py): quality, tokenizer agreement, latency.

    run = score_llamacpp(windows, ["llamacpp-q8_0", "llamacpp-q4_0"], prefix=256)   # windows: (W, T) project ids
    compare(run.reference, run.scores["llamacpp-q4_0"])      # codeckv.measure.lockstep: KLD, top-1, ΔNLL vs f16
    run.bytes["llamacpp-q4_0"]                               # rule, allocated and serialized bytes, per window
    tokenizer_agreement(windows, loaded.tokenizer.decode)    # does llama.cpp tokenize the windows' text the same?
    decode_latency(ids_8k, ["llamacpp-q4_0"], contexts=[1024, 4096, 8192])   # ms/token beside llama.cpp's f16

Quality protocol (codeckv/measure/lockstep.py, on llama.cpp): each window of T token ids prefills its first P
as one batch, then the rest is fed one token at a time; the forward of token t (P <= t < T - 1) predicts
token t + 1, and its log-probs are scored. The ids are the project's (transformers' tokenizer), fed to
llama.cpp as ids, never as text. llama.cpp's f16 cache (LLAMACPP_REFERENCE) runs first and gives the
Reference; every peer is compared with it, so `compare(run.reference, run.scores[name])` is the row
`quality` shows for a tier against native. Each configuration runs all the windows in one context (reset
between windows), one configuration at a time: memory is one context's plus the reference log-probs
(W x positions x vocab float32, 200 MB for 4 x 255 x 49152).
"""

from __future__ import annotations

import difflib
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

import torch

from codeckv.measure.llamacpp import (
    DEFAULT_THREADS,
    LLAMACPP_REFERENCE,
    Engine,
    LlamaCppPeer,
    get_llamacpp_peer,
    open_engine,
    rule_bytes_per_token,
)
from codeckv.measure.lockstep import Reference, Scores, kl_divergence
from codeckv.models import DEFAULT_MODEL

Progress = Callable[[int, int, str], None]  # (forwards done, forwards in all, message); may raise to stop
PREFILL_CHUNK = 512  # tokens per llama_decode when prefilling a long context (decode_latency)
WARMUP_STEPS = 2  # decode steps of every configuration before timing starts (decode_latency)


@dataclass
class LlamaCppBytes:
    """One configuration's KV bytes for a window's tokens: by the rule, and as llama.cpp held them."""

    peer: str
    tokens: int  # tokens the cache held at the end of a window
    rule_bytes: int  # tokens x K + V bytes per token by ggml's block sizes
    f16_rule_bytes: int  # the same tokens in f16 (= the project's bf16 reference bytes)
    state_bytes: int  # llama.cpp's serialization of those tokens' cells (rows + 12 bytes a cell + headers)
    kv_buffer_bytes: int  # the KV buffer the context allocated, for all its cells (+-5 KiB: logged in MiB)
    cells: int  # cells allocated (n_ctx rounded up to a multiple of 256)
    rotated: bool  # llama.cpp rotated K or V (Hadamard) before quantizing

    @property
    def ratio_vs_f16(self) -> float:
        return self.rule_bytes / self.f16_rule_bytes

    @property
    def buffer_bytes_per_cell(self) -> float:
        return self.kv_buffer_bytes / self.cells


@dataclass
class LlamaCppQuality:
    """llama.cpp's f16 reference and every peer's Scores on the same windows, with their bytes."""

    reference: Reference
    scores: dict[str, Scores]  # peer name -> per-position metrics against the reference (f16's own: exactly 0)
    bytes: dict[str, LlamaCppBytes]
    seconds: dict[str, float]  # wall time of each configuration over all windows


def _check(windows: torch.Tensor, prefix: int) -> None:
    if windows.dim() != 2 or windows.shape[1] < 4:
        raise ValueError(f"need (windows, tokens) ids with at least 4 tokens each, got shape {tuple(windows.shape)}")
    if not 1 <= prefix <= windows.shape[1] - 2:
        raise ValueError(f"prefix={prefix} must leave at least one scored position (1..{windows.shape[1] - 2})")


def _window_logprobs(engine: Engine, window: list[int], prefix: int, on_step: Callable[[], None]) -> torch.Tensor:
    """Prefill window[:prefix] as one batch, then feed window[prefix:-1] one at a time -> (positions, vocab) fp32."""
    engine.reset()
    engine.feed(window[:prefix])  # predicts window[prefix], which is not scored (lockstep's protocol)
    rows = []
    for t in range(prefix, len(window) - 1):
        rows.append(torch.from_numpy(engine.feed(window[t : t + 1])))
        on_step()
    return torch.log_softmax(torch.stack(rows), dim=-1)


def score_llamacpp(
    windows: torch.Tensor,
    peers: Sequence[LlamaCppPeer | str],
    prefix: int | None = None,
    model_name: str = DEFAULT_MODEL,
    n_threads: int = DEFAULT_THREADS,
    progress: Progress | None = None,
) -> LlamaCppQuality:
    """llama.cpp's f16 cache, then each peer, on the windows (W, T) of project token ids; prefix P default T // 2.

    The Reference is llama.cpp's f16 run: its log-probs (W, positions, vocab) and NLL. Asking for the
    reference itself ("llamacpp-f16") costs nothing more: its Scores are its own run, KLD exactly 0.
    """
    prefix = windows.shape[1] // 2 if prefix is None else prefix
    _check(windows, prefix)
    peers = [get_llamacpp_peer(p) if isinstance(p, str) else p for p in peers]
    runs = [LLAMACPP_REFERENCE, *(p for p in peers if p != LLAMACPP_REFERENCE)]
    ids = windows.tolist()
    held = windows.shape[1] - 1  # tokens in the cache at a window's end (the last token is only a target)
    targets = windows[:, prefix + 1 :]  # (W, positions)
    total, done = len(runs) * windows.shape[0] * (windows.shape[1] - 1 - prefix), 0
    reference, scores, sizes, seconds = None, {}, {}, {}
    for peer in runs:
        def on_step(peer: LlamaCppPeer = peer) -> None:
            nonlocal done
            done += 1
            if progress:
                progress(done, total, peer.name)

        start = time.perf_counter()
        with open_engine(peer, model_name, n_ctx=held, n_batch=max(prefix, 1), n_threads=n_threads) as engine:
            nll, kld, top1 = [], [], []
            logprobs = []
            for w, window in enumerate(ids):
                got = _window_logprobs(engine, window, prefix, on_step)  # (positions, vocab)
                want = got if reference is None else reference.logprobs[w]
                logprobs.append(got)
                nll.append(-got.gather(-1, targets[w, :, None]).squeeze(-1))
                kld.append(kl_divergence(want, got))
                top1.append(got.argmax(-1) == want.argmax(-1))
            sizes[peer.name] = _bytes(engine, peer, held)
        seconds[peer.name] = time.perf_counter() - start
        if reference is None:
            stacked = torch.stack(logprobs)  # (W, positions, vocab)
            reference = Reference(windows.cpu(), prefix, stacked, torch.stack(nll))
        scores[peer.name] = Scores(torch.stack(nll), torch.stack(kld), torch.stack(top1))
    return LlamaCppQuality(reference, scores, sizes, seconds)


def _bytes(engine: Engine, peer: LlamaCppPeer, tokens: int) -> LlamaCppBytes:
    """The engine's bytes right after a window: it holds `tokens` tokens."""
    return LlamaCppBytes(
        peer=peer.name,
        tokens=tokens,
        rule_bytes=tokens * rule_bytes_per_token(peer, engine.geometry),
        f16_rule_bytes=tokens * rule_bytes_per_token(LLAMACPP_REFERENCE, engine.geometry),
        state_bytes=engine.state_bytes(),
        kv_buffer_bytes=engine.kv_buffer_bytes,
        cells=engine.cells,
        rotated=engine.rotated["k"] or engine.rotated["v"],
    )


@dataclass
class TokenizerAgreement:
    """llama.cpp's tokenization of each window's text against the project's ids for it."""

    windows: int
    identical_windows: int  # windows whose ids llama.cpp reproduces exactly
    tokens: int  # the project's ids, all windows
    matched_tokens: int  # of them, in blocks both tokenizations share (difflib), so a shifted tail still counts
    differences: list[str]  # the first few differing spans, as "window w: project [..] vs llama.cpp [..]"

    @property
    def fraction(self) -> float:
        return self.matched_tokens / self.tokens


def tokenizer_agreement(windows: torch.Tensor, decode: Callable[[list[int]], str], model_name: str = DEFAULT_MODEL,
                        shown: int = 5) -> TokenizerAgreement:
    """Decode each window's ids with the project's tokenizer (`decode`), tokenize that text with llama.cpp, compare.

    A window is cut mid-text, so its first token can legitimately merge differently with what precedes it
    in llama.cpp's tokenization of the detached text; such boundary spans are listed in `differences`.
    """
    identical, matched, differences = 0, 0, []
    with open_engine(LLAMACPP_REFERENCE, model_name, n_ctx=1) as engine:  # the vocabulary only: no token is fed
        for w, window in enumerate(windows.tolist()):
            theirs = engine.tokenize(decode(window))
            identical += theirs == window
            matcher = difflib.SequenceMatcher(a=window, b=theirs, autojunk=False)
            matched += sum(block.size for block in matcher.get_matching_blocks())
            for tag, a0, a1, b0, b1 in matcher.get_opcodes():
                if tag != "equal" and len(differences) < shown:
                    differences.append(f"window {w}: project {window[a0:a1]} vs llama.cpp {theirs[b0:b1]}")
    return TokenizerAgreement(windows.shape[0], identical, windows.numel(), matched, differences)


@dataclass
class LatencyRow:
    """Decode ms/token of one configuration at one context length, beside llama.cpp's f16 in the same moments."""

    peer: str
    context: int  # tokens prefilled before the timed steps
    threads: int
    steps: int  # timed decode steps
    prefill_s: float
    decode_ms: float  # median of the timed steps
    f16_decode_ms: float
    ratio_vs_f16: float
    token_match: float  # fraction of greedy tokens equal to f16's


def decode_latency(
    ids: torch.Tensor | Sequence[int],
    peers: Sequence[LlamaCppPeer | str],
    contexts: Sequence[int],
    steps: int = 32,
    model_name: str = DEFAULT_MODEL,
    n_threads: int = DEFAULT_THREADS,
    progress: Callable[[str], None] | None = None,
) -> list[LatencyRow]:
    """Per context N: prefill ids[:N] (PREFILL_CHUNK tokens a batch) in f16 and each peer, then decode greedily.

    All configurations of a context decode in turns, one token each (round robin, the order reversed every
    round), so their medians come from the same moments; the first WARMUP_STEPS steps are not timed. `ids`
    holds at least max(contexts) project token ids (e.g. corpus_windows(tokenizer, 1, 8192)[0]).
    """
    if steps <= WARMUP_STEPS:
        raise ValueError(f"steps={steps} leaves no timed step (allowed: more than {WARMUP_STEPS})")
    ids = [int(i) for i in (ids.flatten().tolist() if isinstance(ids, torch.Tensor) else ids)]
    if max(contexts) > len(ids):
        raise ValueError(f"context {max(contexts)} needs that many ids, got {len(ids)}")
    peers = [get_llamacpp_peer(p) if isinstance(p, str) else p for p in peers]
    runs = [LLAMACPP_REFERENCE, *(p for p in peers if p != LLAMACPP_REFERENCE)]
    rows = []
    for context in contexts:
        with ExitStack() as engines:
            decoders = [_Decoder(engines.enter_context(open_engine(p, model_name, context + WARMUP_STEPS + steps,
                                                                   PREFILL_CHUNK, n_threads)), ids[:context])
                        for p in runs]
            for step in range(WARMUP_STEPS + steps):
                for decoder in decoders if step % 2 == 0 else reversed(decoders):
                    decoder.step(timed=step >= WARMUP_STEPS)
        base = decoders[0]
        f16_ms = statistics.median(base.milliseconds)
        for decoder in decoders:
            ms = statistics.median(decoder.milliseconds)
            same = sum(a == b for a, b in zip(decoder.tokens, base.tokens)) / len(base.tokens)
            rows.append(LatencyRow(decoder.engine.peer.name, context, n_threads, len(decoder.milliseconds),
                                   round(decoder.prefill_s, 3), round(ms, 3), round(f16_ms, 3), round(ms / f16_ms, 3),
                                   same))
        if progress:
            progress(f"{len(runs)} configurations at {context} tokens")
    return rows


class _Decoder:
    """One engine prefilled with a context, then generating greedily one token per step, timing every step."""

    def __init__(self, engine: Engine, context: list[int]) -> None:
        self.engine = engine
        start = time.perf_counter()
        logits = engine.feed(context)
        self.prefill_s = time.perf_counter() - start
        self.tokens = [int(logits.argmax())]
        self.milliseconds: list[float] = []

    def step(self, timed: bool) -> None:
        """Feed the last greedy token, pick the next one."""
        start = time.perf_counter()
        logits = self.engine.feed(self.tokens[-1:])
        if timed:
            self.milliseconds.append((time.perf_counter() - start) * 1e3)
        self.tokens.append(int(logits.argmax()))
