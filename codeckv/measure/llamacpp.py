"""llama.cpp's KV-cache types as peers: the registry, whether they can run here, and the engine that runs them.

    peer = get_llamacpp_peer("llamacpp-q4_0")          # K and V types, ggml names
    llamacpp_absent_reason(peer, "smollm2-135m")      # None, or one line: why it cannot run here (package, model)
    with open_engine(peer, "smollm2-135m", n_ctx=512) as engine:
        logits = engine.feed(ids[:256])                # (vocab,) float32: the prediction after the last fed token
        logits = engine.feed(ids[256:257])             # one more token through the same cache
        engine.kv_buffer_bytes, engine.state_bytes()   # what the context allocated; what its tokens take
        engine.greedy(prompt_ids, max_new_tokens=16)   # Generation: ids and text, stopped at end of generation
    rule_bytes_per_token(peer, engine.geometry)        # K + V bytes per token by ggml's block sizes

CPU users who want a smaller KV cache run llama.cpp, whose cache stores K and V in a ggml type each
(`--cache-type-k/-v`). Its Python binding, llama-cpp-python, runs them on the very GGUF file this project
embeds, so every peer here is that file with one (type_k, type_v), flash attention always on (a quantized
V cache needs it). The reference is llama.cpp's own f16 cache (LLAMACPP_REFERENCE): a peer's KLD, top-1
and ΔNLL are measured against it on the same token ids (codeckv/measure/llamacpp_runs.py), never against
the transformers model, whose float32 weights differ from llama.cpp's Q4_1 ones.

Bytes. A ggml block holds 32 values of one row: q8_0 34 bytes (an f16 scale + 32 int8), q4_0 18 (scale +
16 bytes of nibbles), q4_1 20 (scale, min), q5_0 22 (scale, 4 bytes of fifth bits), iq4_nl 18 (scale +
nibbles indexing a fixed non-linear table); f16 64 (BLOCK_BYTES; ggml-common.h's static_asserts, and
`ggml_block_sizes()` asks the built library). A row is one token's kv_heads x head_dim values of one layer,
so K + V bytes per token = layers x kv_heads x head_dim / 32 x (K block + V block). Measured beside it:
`kv_buffer_bytes`, the KV buffer the context allocates at creation for all its cells (llama.cpp pads
n_ctx to a multiple of 256; read from its log line, printed in MiB with two decimals, so +-5 KiB), and
`state_bytes()`, llama.cpp's serialization of the sequence's cells (their K and V rows exactly, plus 12
bytes per cell for its position and sequence and a few headers).
A hybrid model (gemma3-270m) keeps its sliding-window layers in the same types but holds at most about a
window of tokens there: the rule, which counts every layer for every token, is then an upper bound.

Rotation. For a quantized type and head_dim a multiple of 64, this llama.cpp (0.3.36's vendor copy)
multiplies K and V by a Hadamard matrix before quantizing them and undoes it in attention (`attn_rot_k`,
`attn_rot_v` in its log; `LLAMA_ATTN_ROT_DISABLE=1` in the environment turns it off); `engine.rotated`
says what the context did.

Logging. llama-cpp-python 0.3.36 maps ggml's log levels with a stale table (ggml's WARN = 3 read as an
error, ERROR = 4 as debug), so with verbose=False it prints llama.cpp's warnings and hides its errors.
The first Engine therefore installs this module's handler for the process (llama_log_set): llama.cpp's
errors go to stderr, everything else only when an Engine is created with verbose=True; the lines logged
while a context is created are also read here (the KV buffer size, the rotation flags).
"""

from __future__ import annotations

import ctypes
import importlib.util
import re
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from codeckv.models import DEFAULT_MODEL, EMBEDDED

PACKAGE = "llama_cpp"  # import name of llama-cpp-python
INSTALL_HINT = ("scripts/setup.sh --llamacpp in a checkout, or pip install 'codeckv[llamacpp]', which is "
                "llama-cpp-python==0.3.36 (it compiles llama.cpp: about 11 minutes on 2 cores)")
BLOCK_VALUES = 32  # values per block of every quantized type below (QK8_0, QK4_0, QK4_1, QK5_0, QK4_NL)
BLOCK_BYTES = {"f16": 64, "q8_0": 34, "q5_0": 22, "q4_1": 20, "q4_0": 18, "iq4_nl": 18}  # bytes per 32 values
DEFAULT_THREADS = 1  # one thread: every run computes the same sums in the same order (bitwise repeatable)
# where a peer's attention reads its tokens (quality rows' `attention`): ggml's CPU flash attention takes K's
# dot products on its blocks (the query converted to K's dot type) and dequantizes V one row at a time
ATTENTION = "llama.cpp flash attention on the blocks"


@dataclass(frozen=True)
class LlamaCppPeer:
    """One llama.cpp KV-cache configuration: the ggml type of its keys and of its values."""

    name: str
    description: str
    type_k: str  # a BLOCK_BYTES key
    type_v: str

    is_native = False  # read where a tier's is_native is (quality rows, needle): llama.cpp's f16 is not the model's

    def __post_init__(self) -> None:
        for side, kind in (("type_k", self.type_k), ("type_v", self.type_v)):
            if kind not in BLOCK_BYTES:
                raise ValueError(f"LlamaCppPeer {self.name!r}: {side}={kind!r} (allowed: {', '.join(BLOCK_BYTES)})")


def _peer(type_k: str, type_v: str | None = None, name: str | None = None) -> LlamaCppPeer:
    type_v = type_v or type_k
    kinds = type_k if type_v == type_k else f"{type_k} keys, {type_v} values"
    return LlamaCppPeer(name or f"llamacpp-{type_k}", f"llama.cpp KV cache, {kinds} (flash attention, the same GGUF)",
                        type_k, type_v)


LLAMACPP_REFERENCE = _peer("f16")  # llama.cpp's native cache: what every llama.cpp peer is compared with
LLAMACPP_PEERS: dict[str, LlamaCppPeer] = {p.name: p for p in (
    LLAMACPP_REFERENCE, _peer("q8_0"), _peer("q5_0"), _peer("q4_1"), _peer("q4_0"), _peer("iq4_nl"),
    _peer("q8_0", "q4_0", "llamacpp-k8v4"),
)}


def get_llamacpp_peer(name: str) -> LlamaCppPeer:
    """LLAMACPP_PEERS[name], or a ValueError listing the names."""
    if name not in LLAMACPP_PEERS:
        raise ValueError(f"unknown llama.cpp peer {name!r} (allowed: {', '.join(LLAMACPP_PEERS)})")
    return LLAMACPP_PEERS[name]


def llamacpp_absent_reason(peer: LlamaCppPeer, model_name: str = DEFAULT_MODEL) -> str | None:
    """Why `peer` cannot run here, in one line (None: it can): llama-cpp-python is missing, or the model has no GGUF."""
    if importlib.util.find_spec(PACKAGE) is None:
        return f"{peer.name}: absent, llama-cpp-python is not installed ({INSTALL_HINT})"
    if model_name not in EMBEDDED:
        return (f"{peer.name}: absent, llama.cpp runs the embedded GGUF models only ({', '.join(EMBEDDED)}), "
                f"not {model_name}")
    if importlib.util.find_spec(EMBEDDED[model_name].package) is None:
        return f"{peer.name}: absent, {model_name}'s GGUF is not installed ({EMBEDDED[model_name].install_hint})"
    return None


@dataclass(frozen=True)
class KVGeometry:
    """What one token's KV row is made of, as llama.cpp reads the GGUF."""

    layers: int
    kv_heads: int
    head_dim: int

    @property
    def values_per_token(self) -> int:
        """Values per token on one side (K or V), all layers."""
        return self.layers * self.kv_heads * self.head_dim


def side_bytes_per_token(kind: str, geometry: KVGeometry) -> int:
    """One side's bytes per token in ggml type `kind`: its blocks of BLOCK_VALUES values."""
    if geometry.kv_heads * geometry.head_dim % BLOCK_VALUES:
        raise ValueError(f"a row of {geometry.kv_heads} x {geometry.head_dim} values is not whole blocks of "
                         f"{BLOCK_VALUES}: ggml cannot store it as {kind}")
    return geometry.values_per_token // BLOCK_VALUES * BLOCK_BYTES[kind]


def rule_bytes_per_token(peer: LlamaCppPeer, geometry: KVGeometry) -> int:
    """K + V bytes per token by ggml's block sizes (f16: 2 bytes a value, the project's bf16 reference size)."""
    return side_bytes_per_token(peer.type_k, geometry) + side_bytes_per_token(peer.type_v, geometry)


def ggml_block_sizes() -> dict[str, tuple[int, int]]:
    """type -> (values per block, bytes per block) for every BLOCK_BYTES type, asked of the built ggml library."""
    llama_cpp = _import_llama_cpp()
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    found = sorted(lib_dir.glob("libggml-base.*"))
    if not found:
        raise RuntimeError(f"no libggml-base library in {lib_dir}: is llama-cpp-python built with shared libraries?")
    ggml = ctypes.CDLL(str(found[0]))
    ggml.ggml_blck_size.restype, ggml.ggml_blck_size.argtypes = ctypes.c_int64, [ctypes.c_int]
    ggml.ggml_type_size.restype, ggml.ggml_type_size.argtypes = ctypes.c_size_t, [ctypes.c_int]
    sizes = {}
    for kind in BLOCK_BYTES:
        type_id = _ggml_type(llama_cpp, kind)
        sizes[kind] = (ggml.ggml_blck_size(type_id), ggml.ggml_type_size(type_id))
    return sizes


def _import_llama_cpp():
    """The llama_cpp module, or a RuntimeError with the install command (never an ImportError's stack trace)."""
    if importlib.util.find_spec(PACKAGE) is None:
        raise RuntimeError(f"llama-cpp-python is not installed ({INSTALL_HINT})")
    import llama_cpp

    return llama_cpp


def _ggml_type(llama_cpp, kind: str) -> int:
    """The GGML_TYPE_* id of a BLOCK_BYTES type name ("q8_0" -> GGML_TYPE_Q8_0)."""
    return getattr(llama_cpp, f"GGML_TYPE_{kind.upper()}")


def gguf_path(model_name: str = DEFAULT_MODEL) -> Path:
    """The embedded model's GGUF file; ValueError for a model without one, ModelUnavailableError if not installed."""
    if model_name not in EMBEDDED:
        raise ValueError(f"llama.cpp runs the embedded GGUF models only (allowed: {', '.join(EMBEDDED)}), "
                         f"got {model_name!r}")
    return EMBEDDED[model_name].gguf_path()


@dataclass
class Generation:
    """A greedy answer: the generated ids (the end-of-generation token excluded) and their text."""

    ids: list[int]
    text: str
    stopped: bool  # an end-of-generation token came before max_new_tokens
    prefill_s: float
    decode_ms: list[float]  # each forward after the prefill (one per kept token, except at max_new_tokens)


class Engine:
    """One llama.cpp context over the GGUF with a peer's cache types: feed token ids, read the next-token logits.

    `n_ctx` is the most tokens the cache will hold; `n_batch` the most fed in one llama_decode (a prefill of
    at most n_batch tokens is one batch); `n_threads` is used for batches and single tokens alike.
    """

    def __init__(self, peer: LlamaCppPeer, model_name: str = DEFAULT_MODEL, n_ctx: int = 512,
                 n_batch: int | None = None, n_threads: int = DEFAULT_THREADS, verbose: bool = False) -> None:
        reason = llamacpp_absent_reason(peer, model_name)
        if reason:
            raise RuntimeError(reason)
        if n_ctx < 1 or n_threads < 1:
            raise ValueError(f"n_ctx={n_ctx} and n_threads={n_threads} must be at least 1")
        llama_cpp = _import_llama_cpp()
        self.peer, self.model_name, self.n_threads = peer, model_name, n_threads
        self._llama_cpp = llama_cpp
        n_batch = min(n_batch or n_ctx, n_ctx)
        with _captured_log(llama_cpp, verbose) as log:
            try:
                self.llama = llama_cpp.Llama(
                    str(gguf_path(model_name)), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                    n_threads=n_threads, n_threads_batch=n_threads, flash_attn=True,
                    type_k=_ggml_type(llama_cpp, peer.type_k), type_v=_ggml_type(llama_cpp, peer.type_v),
                    logits_all=False, verbose=verbose,
                )
            except (ValueError, RuntimeError) as err:
                raise RuntimeError(f"{peer.name}: llama.cpp could not open {model_name} with "
                                   f"type_k={peer.type_k}, type_v={peer.type_v}, n_ctx={n_ctx}: {err}") from err
        text = "".join(log)
        self.kv_buffer_bytes = round(sum(float(mib) for mib in re.findall(r"KV buffer size =\s*([\d.]+) MiB", text))
                                     * 2**20)  # every KV buffer (a hybrid model has two caches)
        self.cells = sum(int(cells) for cells in re.findall(r"\(\s*(\d+) cells", text))
        self.rotated = {side: bool(re.search(rf"attn_rot_{side} = 1", text)) for side in ("k", "v")}
        model = self.llama.model
        self.geometry = KVGeometry(llama_cpp.llama_model_n_layer(model), llama_cpp.llama_model_n_head_kv(model),
                                   llama_cpp.llama_model_n_embd(model) // llama_cpp.llama_model_n_head(model))
        self.n_vocab = self.llama.n_vocab()
        self._vocab = llama_cpp.llama_model_get_vocab(model)

    @property
    def tokens(self) -> int:
        """Tokens the cache holds."""
        return self.llama.n_tokens

    def reset(self) -> None:
        """Empty the cache: the next feed starts at position 0."""
        self.llama.reset()

    def feed(self, ids: Sequence[int]) -> np.ndarray:
        """Feed token ids after those held (in batches of n_batch); the next-token logits (vocab,) float32."""
        if not len(ids):
            raise ValueError(f"{self.peer.name}: feed at least one token id")
        if self.tokens + len(ids) > self.llama.n_ctx():
            raise ValueError(f"{self.peer.name}: {self.tokens} + {len(ids)} tokens exceed n_ctx={self.llama.n_ctx()}")
        self.llama.eval([int(i) for i in ids])
        logits = self._llama_cpp.llama_get_logits_ith(self.llama.ctx, -1)
        return np.ctypeslib.as_array(logits, shape=(self.n_vocab,)).copy()

    def state_bytes(self) -> int:
        """Bytes of llama.cpp's serialization of the held tokens' cells (K and V rows + 12 bytes a cell + headers)."""
        return self._llama_cpp.llama_state_seq_get_size(self.llama.ctx, 0)

    def is_end(self, token: int) -> bool:
        """True for an end-of-generation token of the GGUF's vocabulary (EOS, end of turn)."""
        return bool(self._llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's tokenization of `text`: no BOS added, special tokens parsed (as transformers does)."""
        return self.llama.tokenize(text.encode(), add_bos=False, special=True)

    def detokenize(self, ids: Sequence[int]) -> str:
        """llama.cpp's text of `ids` (special tokens rendered as nothing)."""
        return self.llama.detokenize(list(ids)).decode(errors="replace")

    def greedy(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Generation:
        """Reset, prefill the prompt, then pick the argmax token until an end-of-generation token or max_new_tokens."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be at least 1")
        self.reset()
        start = time.perf_counter()
        logits = self.feed(prompt_ids)
        prefill_s = time.perf_counter() - start
        ids, seconds = [], []
        while True:
            token = int(logits.argmax())
            if self.is_end(token):
                return Generation(ids, self.detokenize(ids), True, prefill_s, seconds)
            ids.append(token)
            if len(ids) == max_new_tokens:
                return Generation(ids, self.detokenize(ids), False, prefill_s, seconds)
            start = time.perf_counter()
            logits = self.feed([token])
            seconds.append((time.perf_counter() - start) * 1e3)

    def close(self) -> None:
        """Free the context and the model."""
        self.llama.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_engine(peer: LlamaCppPeer | str, model_name: str = DEFAULT_MODEL, n_ctx: int = 512,
                n_batch: int | None = None, n_threads: int = DEFAULT_THREADS, verbose: bool = False) -> Engine:
    """An Engine for a peer (or its name); use it as a context manager so the context is freed."""
    peer = get_llamacpp_peer(peer) if isinstance(peer, str) else peer
    return Engine(peer, model_name, n_ctx, n_batch, n_threads, verbose)


GGML_LOG_ERROR, GGML_LOG_CONT = 4, 5  # ggml.h's enum ggml_log_level


class _Log:
    """The state of this module's llama.cpp log handler: where lines go while a context is created."""

    lines: list[str] | None = None  # collecting (one Engine being created) or not
    echo = False  # print every line (verbose), not only errors
    last_level = 0  # a GGML_LOG_CONT line continues the previous line's level
    handler = None  # the ctypes callback, kept alive while llama.cpp holds it


def _on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    line = text.decode(errors="replace")
    level = _Log.last_level if level == GGML_LOG_CONT else level
    _Log.last_level = level
    if _Log.lines is not None:
        _Log.lines.append(line)
    if _Log.echo or level == GGML_LOG_ERROR:
        sys.stderr.write(line)


@contextmanager
def _captured_log(llama_cpp, verbose: bool) -> Iterator[list[str]]:
    """Install this module's log handler (once per process) and collect the lines logged inside the block."""
    if _Log.handler is None:
        _Log.handler = llama_cpp.llama_log_callback(_on_log)
        llama_cpp.llama_log_set(_Log.handler, ctypes.c_void_p(0))
    _Log.lines, _Log.echo = [], verbose
    try:
        yield _Log.lines
    finally:
        _Log.lines, _Log.echo = None, False
