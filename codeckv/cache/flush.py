"""Archiving across layers: what every codec layer can archive now, in batched encodes per codec.

    flush_layers(cache.layers)      # CodecCache.flush and CodecCache.from_cache; CodecLayer.flush: flush_layers([self])

A layer offers `_archivable()` (tokens to archive now), `_span(count)` (those tokens, keys and values),
`needs_decoded` and `_archived(count, keys, values, decoded)` (store the parts, advance); codeckv/cache/layers.py.
Encoding and decoding go through kernels.encode / kernels.decode (Triton on CUDA, the codecs elsewhere).
"""

from __future__ import annotations

import torch

from codeckv.cache.kernel_ops import decode, encode
from codeckv.codecs.ans_vectorized import ENCODE_BATCH_SYMBOLS
from codeckv.codecs.base import concat_encoded, split_heads
from codeckv.codecs.pca import archive_layers

# flush_layers encodes at most about this many bytes of tokens per call. On a CPU, passes over a batch that
# stays in the cache are faster than fewer passes over one that does not (a 1k-token prompt of smollm2-135m,
# 30 layers of turbo-4: 0.16 s in 2 MiB batches, 0.47 s in one); a GPU wants few, large launches.
BATCH_BYTES = {"cpu": 2 << 20, "cuda": 64 << 20}
# PCA layers are archived together in passes of about this many codes (int32 codes and the entropy coder's
# tables: some 100 MiB at most); one numpy pass of the coder costs about as much for 512 streams as for 64.
PCA_BATCH_SYMBOLS = ENCODE_BATCH_SYMBOLS


@torch.inference_mode()
def flush_layers(layers: list) -> None:
    """Archive now what each layer would archive at its next update, batched across layers.

    Layers of one tier with the same count of pending tokens and the same geometry are encoded (and
    decoded, for views) together, their heads side by side, in batches of about BATCH_BYTES: every codec
    treats each (batch, head) row on its own, so each layer stores what its own flush would store. A short
    prompt then costs a few encodes per codec instead of one per layer (CodecCache.flush, from_cache).
    """
    groups: dict[tuple, list] = {}
    pca = []  # PCA layers code K and V together, each with its own coder: their entropy coding is batched
    for layer in layers:
        if layer.tier.joint is not None:
            pca.append(layer)
            continue
        count = layer._archivable()
        if count > 0:
            k, v = layer._span(count)
            key = (count, k.shape[0], k.shape[3], v.shape[3], k.dtype, k.device, layer.tier)
            groups.setdefault(key, []).append(layer)
    for (count, *_, device, _tier), members in groups.items():
        limit = BATCH_BYTES.get(device.type, BATCH_BYTES["cuda"])
        batch: list = []
        size = 0
        for layer in members:
            k, v = layer._span(count)
            batch.append(layer)
            size += k.numel() * k.element_size() + v.numel() * v.element_size()
            if size >= limit or layer is members[-1]:
                _flush_batch(batch, count, limit)
                batch, size = [], 0
    _flush_pca(pca)


def _flush_pca(layers: list) -> None:
    """Archive what each PCA layer can, in passes of at most PCA_BATCH_SYMBOLS codes (codecs/pca.py archive_layers:
    one entropy-coding pass over many layers' streams; each layer stores what its own flush would). A pass takes
    the layers that fit whole: one layer over the limit would cost the coder a pass of its own for its few streams
    (a numpy pass costs its streams' length in steps, however few they are)."""
    batch, size = [], 0

    def archive() -> None:
        for (member, _), result in zip(batch, archive_layers([request for _, request in batch])):
            member._flushed(*result)

    for layer in layers:
        request = layer._flush_request()
        if request is None:
            continue
        symbols = request[1].shape[0] * request[1].shape[2] * request[0].kept
        if batch and size + symbols > PCA_BATCH_SYMBOLS:
            archive()
            batch, size = [], 0
        batch.append((layer, request))
        size += symbols
    if batch:
        archive()


def _flush_batch(layers: list, count: int, limit: int) -> None:
    """Encode the next `count` tokens of every layer (same tier and geometry) at once, hand each layer its part.

    A span larger than `limit` bytes (a long prompt) is encoded in runs of whole archive units, which
    stores the same bytes: every codec encodes consecutive blocks independently (codecs/base.py).
    """
    tier = layers[0].tier
    spans = [layer._span(count) for layer in layers]
    heads = [k.shape[1] for k, _ in spans]
    wanted = any(layer.needs_decoded for layer in layers)
    stored, decoded = [], []
    for side, codec in ((0, tier.key), (1, tier.value)):
        tokens = spans[0][side] if len(spans) == 1 else torch.cat([span[side] for span in spans], dim=1)
        unit = layers[0].unit
        step = max(unit, limit // max(tokens[:, :, :1].numel() * tokens.element_size(), 1) // unit * unit)
        parts = [encode(tokens[:, :, lo : lo + step], codec) for lo in range(0, count, step)]
        encoded = parts[0] if len(parts) == 1 else concat_encoded(parts)
        stored.append(split_heads(encoded, heads))
        if wanted:
            pieces = [decode(part, codec) for part in parts]
            whole = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2)
            decoded.append(whole.split(heads, dim=1))
        else:
            decoded.append([None] * len(layers))
    for i, layer in enumerate(layers):
        pair = None if decoded[0][i] is None else (decoded[0][i], decoded[1][i])
        layer._archived(count, stored[0][i], stored[1][i], pair)
