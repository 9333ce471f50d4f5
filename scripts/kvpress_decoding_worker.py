"""kvpress's side of scripts/kvpress_reference.py --decoding: run in kvpress's own virtualenv, never codeckv's.

    python kvpress_decoding_worker.py JOB.json OUT.json

JOB holds the converted model's folder, the token ids (the context, then the tokens decoded after it), the context
length and the decoding presses to record: {name: {"press": kvpress scorer class, "target_size": n} or
{"press": ..., "target_compression_ratio": r}, with "compression_interval"}. For each: a fresh DynamicCache, the
context prefilled in one forward inside `with press(model)` (DecodingPress leaves the prefill alone), then the
decoded tokens teacher-forced one at a time at their true positions (position_ids given, as
CompressionRatioDecodingPress needs). Which positions each layer and KV head holds at the end is followed through
every compression: the base press's `score` is wrapped to take the indices its ScorerPress.compress keeps (the top
n_kept of those scores, n_kept from the ratio DecodingPress set), and a position table per layer is gathered by
them, new tokens appended at their positions. Stored as kvpress_worker.py stores kept positions (bits per (KV head,
position), zlib, base64), with the number of compressions each layer made and the KLD / top-1 against native.
"""

from __future__ import annotations

import json
import sys
import time

import kvpress
import torch
from kvpress.utils import compute_n_kept
from kvpress_worker import decode, load_job, pack
from transformers import DynamicCache


def record(model, ids: list[int], context: int, spec: dict, native: torch.Tensor) -> dict:
    """One decoding press over the context and the decoded tokens: what each layer holds at the end (module
    docstring), its compressions, and KLD / top-1 against native's log-probs."""
    base = getattr(kvpress, spec["press"])()
    if "target_compression_ratio" in spec:
        press = kvpress.CompressionRatioDecodingPress(base_press=base, compression_interval=spec["interval"],
                                                      target_compression_ratio=spec["target_compression_ratio"])
    else:
        press = kvpress.DecodingPress(base_press=base, compression_interval=spec["interval"],
                                      target_size=spec["target_size"])
    positions: dict[int, torch.Tensor] = {}  # layer -> (H, held) the position of each held key, in cache order
    compressions: dict[int, int] = {}
    score = base.score

    def follow(layer: int, held: int, seen: int, heads: int) -> torch.Tensor:
        """The layer's position table, with the tokens that arrived since it was last gathered appended."""
        table = positions.get(layer, torch.zeros(heads, 0, dtype=torch.long))
        fresh = torch.arange(seen - (held - table.shape[1]), seen).expand(heads, -1)
        return torch.cat([table, fresh], dim=1)

    def recording(module, hidden_states, keys, values, attentions, kwargs):
        scores = score(module, hidden_states, keys, values, attentions, kwargs)
        layer = module.layer_idx
        table = follow(layer, keys.shape[2], int(kwargs["position_ids"].max()) + 1, keys.shape[1])
        kept = scores.topk(compute_n_kept(keys.shape[2], base.compression_ratio), dim=-1).indices[0]
        positions[layer] = table.gather(1, kept)
        compressions[layer] = compressions.get(layer, 0) + 1
        return scores

    base.score = recording
    cache = DynamicCache()
    with torch.inference_mode(), press(model):
        model(input_ids=torch.tensor([ids[:context]]), past_key_values=cache, use_cache=True)
        got = decode(model, cache, ids, context)
    seen = len(ids) - 1  # every token fed: the context and the decoded ones
    kept = [follow(layer, cache.layers[layer].keys.shape[2], seen, cache.layers[layer].keys.shape[1])
            for layer in range(len(cache.layers))]
    p = native.exp()
    kld = (p * (native - got)).sum(-1).clamp_min(0)
    top1 = (got.argmax(-1) == native.argmax(-1)).double()
    return {**spec, "kld": float(kld.mean()), "top1_pct": 100 * float(top1.mean()),
            "compressions": [compressions.get(layer, 0) for layer in range(len(kept))],
            "held": [int(k.shape[1]) for k in kept], "kept": [pack(k.sort(dim=-1).values, seen) for k in kept]}


def main(job_path: str, out_path: str) -> None:
    job = json.load(open(job_path))
    model, native, result = load_job(job)
    ids, context = job["ids"], job["context"]
    for name, spec in job["presses"].items():
        start = time.perf_counter()
        result["presses"][name] = record(model, ids, context, spec, native)
        print(f"{name}: {result['presses'][name]['compressions'][0]} compressions, layer 0 holds "
              f"{result['presses'][name]['held'][0]}, KLD {result['presses'][name]['kld']:.4f} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    json.dump(result, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
