"""Peers: the caches a user would pick instead of a tier, transformers' own QuantizedCache, measured beside the tiers.

    peer = get_peer("hf-quanto-int4")            # backend, bits, group, axis, residual window
    absent_reason(peer, loaded.info)             # None, or one line: why it cannot run here (package, model)
    cache = make_peer_cache(loaded, peer)        # a transformers QuantizedCache, fed like any cache
    peer_footprint(cache)                        # Footprint from the tensors it holds
    rule_bytes(peer, batch, heads, head_dim, quantized, raw, element_size)   # the same bytes by the storage rule

A peer is not a codeckv Tier: transformers codes it, so it is never in codeckv.tiers.TIERS and the Chat
does not offer it; the quality, needle and long-text sweep measurements accept a peer name wherever they
accept a tier name (`run_for`). Settings are what transformers 5.24 documents: the QuantizedCache defaults
(nbits 4, q_group_size 64, residual_length 128) and its KV-cache guide's axis advice (0 for quanto,
1 for HQQ). With head_dim 64 both group each token's 64 channels of a head: one scale and one zero per
token and head, in the model's dtype.

How a QuantizedLayer holds its tokens (transformers.cache_utils): its first update quantizes all of them;
later tokens stay raw in a residual window, and once the window would reach `residual_length`, the whole
history (dequantized, plus the window, plus the new tokens) is quantized again and the window emptied.
Every forward dequantizes the whole history into a full-precision copy for attention (a transient, not
held between forwards). Bytes are counted from the tensors it holds: packed codes, scales, zeros (quanto's
shifts) and the raw window.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass

import torch
from transformers import Cache
from transformers.cache_utils import QuantizedCache, QuantizedLayer

from codeckv.cache.footprint import Footprint, LayerFootprint
from codeckv.loaded import ModelInfo
from codeckv.measure.llamacpp import LLAMACPP_PEERS, LlamaCppPeer, llamacpp_absent_reason
from codeckv.tiers import TIERS, Tier, get_tier

ATTENTION = "dequantized copy"  # where a peer's attention reads its tokens (quality rows' `attention`)
PACKAGES = {"quanto": ("optimum.quanto", "optimum-quanto"), "hqq": ("hqq", "hqq")}  # backend -> (module, dist)


@dataclass(frozen=True)
class Peer:
    """One transformers QuantizedCache configuration, named like a tier."""

    name: str
    description: str
    backend: str  # "quanto" or "hqq" (transformers' QuantizedCache backends)
    nbits: int
    axis: int  # axis_key = axis_value
    q_group_size: int = 64
    residual_length: int = 128

    is_native = False  # read where a tier's is_native is (quality rows, needle)

    def __post_init__(self) -> None:
        if self.backend not in PACKAGES:
            raise ValueError(f"Peer {self.name!r}: backend={self.backend!r} (allowed: {', '.join(PACKAGES)})")


def _peer(backend: str, nbits: int, axis: int) -> Peer:
    label = {"quanto": "optimum-quanto", "hqq": "HQQ"}[backend]
    return Peer(f"hf-{backend}-int{nbits}",
                f"transformers QuantizedCache, {label} int{nbits}: per-token groups of 64, raw window of 128",
                backend, nbits, axis)


PEERS: dict[str, Peer] = {p.name: p for p in (_peer("quanto", 4, 0), _peer("quanto", 2, 0), _peer("hqq", 4, 1))}
PEER_NAMES = [*PEERS, *LLAMACPP_PEERS]  # every peer a measurement takes by name: transformers' and llama.cpp's


def get_peer(name: str) -> Peer:
    """PEERS[name], or a ValueError listing the peer names."""
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r} (allowed: {', '.join(PEERS)})")
    return PEERS[name]


def run_for(name: str | Tier | Peer | LlamaCppPeer) -> Tier | Peer | LlamaCppPeer:
    """A preset tier, a peer or a llama.cpp KV type by name (a ValueError lists them all), or the object itself."""
    if isinstance(name, Tier | Peer | LlamaCppPeer):
        return name
    if name in PEERS:
        return PEERS[name]
    if name in LLAMACPP_PEERS:
        return LLAMACPP_PEERS[name]
    try:
        return get_tier(name)  # a preset, press+tier or tier-skipN (codeckv/tiers.py)
    except ValueError:
        raise ValueError(f"unknown tier {name!r} (allowed tiers: {', '.join(TIERS)}, press+tier such as "
                         f"snapkv-50+turbo-4, tier-skipN such as turbo-3-skip2; peers: {', '.join(PEERS)}; llama.cpp: "
                         f"{', '.join(LLAMACPP_PEERS)})") from None


def absent_reason(peer: Peer | LlamaCppPeer, info: ModelInfo | None = None) -> str | None:
    """Why `peer` cannot run here, in one line (None: it can): its package is missing, or the model is hybrid
    (transformers' peers), or the model has no GGUF file here (llama.cpp's)."""
    if isinstance(peer, LlamaCppPeer):
        return llamacpp_absent_reason(peer, info.name) if info is not None else llamacpp_absent_reason(peer)
    module, dist = PACKAGES[peer.backend]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package (optimum) is missing
        found = False
    if not found:
        return f"{peer.name}: absent, {dist} is not installed (pip install 'codeckv[peers]')"
    if info is not None and set(info.layer_types) != {"full_attention"}:
        return (f"{peer.name}: absent, transformers' QuantizedCache takes full-attention models only and "
                f"{info.name} has {', '.join(sorted(set(info.layer_types) - {'full_attention'}))} layers")
    return None


def packing_reason(peer: Peer, rows: int, heads: int, tokens: int, head_dim: int) -> str | None:
    """Why `peer` fails to quantize rows x heads x tokens x head_dim at once (None: it does not).

    HQQ packs its 4-bit codes two groups to a byte row and unpacks an even count, so an odd number of
    groups fails (tested). A QuantizedLayer quantizes its first `tokens`, then that plus multiples of its
    window (128, even): all of the same parity.
    """
    groups = rows * heads * tokens * head_dim // peer.q_group_size
    if peer.backend == "hqq" and peer.nbits == 4 and groups % 2:
        return (f"{peer.name}: absent, HQQ's 4-bit packing fails on an odd number of groups "
                f"({rows} rows x {heads} KV heads x {tokens} tokens); choose an even number of windows or of tokens")
    return None


def make_peer_cache(config, peer: Peer) -> QuantizedCache:
    """A fresh QuantizedCache of `peer` for the model of `config` (or of a LoadedModel); ValueError if absent."""
    info = getattr(config, "info", None)
    reason = absent_reason(peer, info)
    if reason:
        raise ValueError(reason)
    config = getattr(config, "model", config)
    config = getattr(config, "config", config)
    return QuantizedCache(peer.backend, config, nbits=peer.nbits, axis_key=peer.axis, axis_value=peer.axis,
                          q_group_size=peer.q_group_size, residual_length=peer.residual_length)


def filled_peer_cache(native: Cache, config, peer: Peer) -> QuantizedCache:
    """A peer cache holding a native cache's tokens: one update per layer, as a one-forward prefill would give."""
    cache = make_peer_cache(config, peer)
    for layer, source in zip(cache.layers, native.layers):
        layer.update(source.keys, source.values)
    return cache


def tensor_bytes(held) -> int:
    """Bytes of every tensor in `held`: a tensor (a quanto wrapper: its inner tensors), a tuple / list or a dict."""
    if isinstance(held, torch.Tensor):
        if hasattr(held, "__tensor_flatten__"):  # a wrapper subclass (quanto): its numel is not what it stores
            names, _ = held.__tensor_flatten__()
            return sum(tensor_bytes(getattr(held, name)) for name in names)
        return held.numel() * held.element_size()
    if isinstance(held, list | tuple):
        return sum(tensor_bytes(item) for item in held)
    if isinstance(held, dict):
        return sum(tensor_bytes(item) for item in held.values())
    return 0


def _quantized_shape(held) -> tuple[int, ...]:
    """(B, H, S, D) of a layer's quantized keys: a quanto tensor's shape, or HQQ's (codes, meta) meta shape."""
    return tuple(held[1]["shape"]) if isinstance(held, tuple) else tuple(held.shape)


def _layer_footprint(index: int, layer: QuantizedLayer) -> LayerFootprint:
    raw = layer.keys.shape[-2] if layer.keys is not None and layer.keys.dim() == 4 else 0
    if layer._quantized_keys is None:
        return LayerFootprint(index, "quantized", True, 0, 0, 0, 0)
    batch, heads, quantized, head_dim = _quantized_shape(layer._quantized_keys)
    codes = tensor_bytes((layer._quantized_keys, layer._quantized_values))
    raw_bytes = tensor_bytes((layer.keys, layer.values)) if raw else 0
    tokens = quantized + raw
    bf16 = 2 * batch * heads * tokens * head_dim * 2
    return LayerFootprint(index, "quantized", True, tokens, codes + raw_bytes, codes + raw_bytes, bf16,
                          archived_tokens=quantized, code_bytes=codes, tail_tokens=raw)


def peer_footprint(cache: QuantizedCache) -> Footprint:
    """Bytes a QuantizedCache holds, per layer, counted from its tensors (no view: what it holds is its archive)."""
    return Footprint([_layer_footprint(index, layer) for index, layer in enumerate(cache.layers)])


def rule_bytes(peer: Peer, batch: int, heads: int, head_dim: int, quantized: int, raw: int, element_size: int) -> int:
    """One layer's K and V bytes by the storage rule: packed codes, a scale and a zero per group, the raw window."""
    values = batch * heads * quantized * head_dim  # per side
    groups = values // peer.q_group_size
    per_side = math.ceil(values * peer.nbits / 8) + 2 * groups * element_size
    return 2 * per_side + 2 * batch * heads * raw * head_dim * element_size


def is_peer_cache(cache) -> bool:
    """True for a cache built by make_peer_cache."""
    return isinstance(cache, QuantizedCache)
