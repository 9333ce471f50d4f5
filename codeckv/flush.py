"""Archiving across layers: what every codec layer can archive now, in one batched encode per codec.

    flush_layers(cache.layers)          # CodecCache.flush and CodecCache.from_cache; CodecLayer.flush([self])

A layer offers `_archivable()` (tokens to archive now), `_span(count)` (those tokens, keys and values),
`needs_decoded` and `_archived(count, keys, values, decoded)` (store the parts, advance); codeckv/layers.py.
Encoding and decoding go through kernels.encode / kernels.decode (Triton on CUDA, the codecs elsewhere).
"""

from __future__ import annotations

import torch

from codeckv.codecs.base import split_heads
from kernels.ops import decode, encode

BATCH_BYTES = 64 << 20  # flush_layers encodes at most about this many bytes of tokens per call


@torch.inference_mode()
def flush_layers(layers: list) -> None:
    """Archive now what each layer would archive at its next update, batched across layers.

    Layers of one tier with the same count of pending tokens and the same geometry are encoded (and
    decoded, for views) in one call per codec, their heads side by side: every codec treats each
    (batch, head) row on its own, so each layer stores what its own flush would store. A prompt's
    prefill then costs one encode per codec instead of one per layer (CodecCache.flush, from_cache).
    """
    groups: dict[tuple, list] = {}
    for layer in layers:
        count = layer._archivable()
        if count > 0:
            k, v = layer._span(count)
            key = (count, k.shape[0], k.shape[3], v.shape[3], k.dtype, k.device, layer.tier)
            groups.setdefault(key, []).append(layer)
    for (count, *_), members in groups.items():
        batch: list = []
        size = 0
        for layer in members:
            k, v = layer._span(count)
            batch.append(layer)
            size += k.numel() * k.element_size() + v.numel() * v.element_size()
            if size >= BATCH_BYTES or layer is members[-1]:
                _flush_batch(batch, count)
                batch, size = [], 0


def _flush_batch(layers: list, count: int) -> None:
    """Encode the next `count` tokens of every layer (same tier and geometry) at once, hand each layer its part."""
    tier = layers[0].tier
    spans = [layer._span(count) for layer in layers]
    heads = [k.shape[1] for k, _ in spans]
    stored, decoded = [], []
    for side, codec in ((0, tier.key), (1, tier.value)):
        tokens = spans[0][side] if len(spans) == 1 else torch.cat([span[side] for span in spans], dim=1)
        encoded = encode(tokens, codec)
        stored.append(split_heads(encoded, heads))
        wanted = any(layer.needs_decoded for layer in layers)
        decoded.append(decode(encoded, codec).split(heads, dim=1) if wanted else [None] * len(layers))
    for i, layer in enumerate(layers):
        pair = None if decoded[0][i] is None else (decoded[0][i], decoded[1][i])
        layer._archived(count, stored[0][i], stored[1][i], pair)
