"""kvpress's side of scripts/kvpress_reference.py: run in kvpress's own virtualenv (transformers 5.2), never codeckv's.

    python kvpress_worker.py JOB.json OUT.json

JOB holds the converted model's folder, the token ids (the context, then the tokens decoded after it), the context
length, {press name: kvpress class} and the ratios. For each press and ratio: a fresh DynamicCache, the context
prefilled once inside `with press(model)` (kvpress's protocol: each layer pressed after its attention), the positions
each layer and KV head kept recorded (the indices kvpress's ScorerPress.compress takes: the top n_kept of the scores
its `score` returned), then the decoded tokens teacher-forced one at a time at their true positions, and their
next-token distributions compared with the native cache's: mean KL(native || pressed) and top-1 agreement.
Kept positions are stored per layer as one bit per (KV head, position), zlib-compressed and base64-encoded.
"""

from __future__ import annotations

import base64
import importlib.metadata
import json
import sys
import time
import zlib

import kvpress
import numpy as np
import torch
import transformers
from kvpress.utils import compute_n_kept
from transformers import AutoModelForCausalLM, DynamicCache


def pack(kept: torch.Tensor, length: int) -> str:
    """(H, k) kept positions of one layer as base64(zlib(bits of an (H, length) mask))."""
    mask = np.zeros((kept.shape[0], length), dtype=bool)
    for head, positions in enumerate(kept.tolist()):
        mask[head, positions] = True
    return base64.b64encode(zlib.compress(np.packbits(mask).tobytes(), 9)).decode()


@torch.inference_mode()
def decode(model, cache, ids: list[int], context: int) -> torch.Tensor:
    """Log-probs (T, vocab) of the tokens after the context, each fed alone at its true position."""
    out = []
    for position in range(context, len(ids) - 1):
        logits = model(input_ids=torch.tensor([[ids[position]]]), past_key_values=cache,
                       position_ids=torch.tensor([[position]]), cache_position=torch.tensor([position]),
                       use_cache=True).logits[0, -1].float()
        out.append(torch.log_softmax(logits, dim=-1))
    return torch.stack(out)


def load_job(job: dict):
    """The job's model (fp32, SDPA), its native log-probs of the decoded tokens, and the record's header."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    ids, context = job["ids"], job["context"]
    with torch.inference_mode():
        native_cache = DynamicCache()
        model(input_ids=torch.tensor([ids[:context]]), past_key_values=native_cache, use_cache=True)
        native = decode(model, native_cache, ids, context)
    result = {"kvpress": importlib.metadata.version("kvpress"), "text": job.get("text", "GPL-3"),
              "transformers": transformers.__version__, "torch": torch.__version__, "model": job["model"],
              "context": context, "decoded": native.shape[0], "ids_head": ids[:8], "presses": {}}
    return model, native, result


def main(job_path: str, out_path: str) -> None:
    job = json.load(open(job_path))
    model, native, result = load_job(job)
    ids, context = job["ids"], job["context"]
    prompt = torch.tensor([ids[:context]])
    for name, cls in job["presses"].items():
        result["presses"][name] = {}
        for ratio in job["ratios"]:
            start = time.perf_counter()
            press = getattr(kvpress, cls)(compression_ratio=ratio)
            kept: dict[int, torch.Tensor] = {}
            score = press.score

            def recording(module, hidden_states, keys, *rest, _score=score, _kept=kept, _ratio=ratio):
                scores = _score(module, hidden_states, keys, *rest)
                n_kept = compute_n_kept(keys.shape[2], _ratio)
                _kept[module.layer_idx] = scores.topk(n_kept, dim=-1).indices[0].sort(dim=-1).values
                return scores

            press.score = recording
            cache = DynamicCache()
            with torch.inference_mode(), press(model):
                model(input_ids=prompt, past_key_values=cache, use_cache=True)
            got = decode(model, cache, ids, context)
            p = native.exp()
            kld = (p * (native - got)).sum(-1).clamp_min(0)
            top1 = (got.argmax(-1) == native.argmax(-1)).double()
            result["presses"][name][str(ratio)] = {
                "kld": float(kld.mean()), "top1_pct": 100 * float(top1.mean()),
                "kept": [pack(kept[layer], context) for layer in sorted(kept)],
            }
            print(f"{name} {ratio}: KLD {float(kld.mean()):.4f}, top-1 {100 * float(top1.mean()):.1f}% "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    json.dump(result, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
