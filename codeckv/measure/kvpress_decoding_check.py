"""The decoding presses against kvpress's own DecodingPress / CompressionRatioDecodingPress, on the same tokens.

    reference = load_reference(FIXTURES / "smollm2-135m-decoding.json")     # scripts/kvpress_reference.py --decoding
    rows = check_decoding(loaded, reference)       # DecodingCheck per tier: Jaccard per layer, compressions, KLD
    rows[0].jaccard_min

kvpress's protocol, as its worker (scripts/kvpress_decoding_worker.py) ran it: the first CONTEXT tokens of the text
prefilled in one forward (a decoding press leaves it alone), then the next STEPS tokens fed one at a time, each a
decoding step; every `interval` steps the press compresses the layer to its target. Here the same tokens go through
the tier's cache the same way (the tier's press must carry the fixture's settings: interval, target or share), and
the positions each layer and KV head holds at the end are compared with kvpress's: Jaccard = |ours ∩ kvpress's| /
|ours ∪ kvpress's| over (KV head, position) pairs, after STEPS // interval compressions. KLD and top-1 are of the
STEPS next-token distributions against native's, each side against its own native.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from codeckv.cache import make_cache
from codeckv.loaded import LoadedModel
from codeckv.measure.generate import next_logits
from codeckv.measure.kvpress_check import jaccard, reference_text, unpack
from codeckv.measure.lockstep import kl_divergence
from codeckv.presses import Decoding
from codeckv.tiers import get_tier

CONTEXT, STEPS = 512, 40  # tokens prefilled, tokens decoded after them: 2 compressions at an interval of 16
DECODING_TIERS = ("tova-decoding256", "knorm-decoding256", "tova-decoding-50", "streamingllm-decoding256")
KVPRESS_SCORERS = {"TOVAPress": "tova", "KnormPress": "knorm", "StreamingLLMPress": "streamingllm"}  # kvpress -> ours
# kvpress's StreamingLLMPress scores cache slots (the first 4 and the last n), and ScorerPress.compress gathers the kept
# keys in topk order, which is not position order where the scores tie: from the second compression on, its slots
# are not its ages, and it evicts some newer tokens and keeps some older ones (on SmolLM2: 350-352, 354-365 and 369
# evicted, 276-349 kept). Ours keeps the 4 sinks and the newest tokens, StreamingLLM's rule; the Jaccard is reported,
# not bounded.
SLOT_ORDER_DEPENDENT = ("streamingllm-decoding256",)


def kvpress_spec(tier_name: str) -> dict:
    """What kvpress's worker runs for a decoding tier: its scorer class, interval and target or share."""
    press = get_tier(tier_name).press
    if not isinstance(press, Decoding):
        raise ValueError(f"{tier_name!r} is not a decoding press tier (allowed: {', '.join(DECODING_TIERS)})")
    scorer = {name: cls for cls, name in KVPRESS_SCORERS.items()}[tier_name.split("-")[0]]
    spec = {"press": scorer, "interval": press.interval}
    return spec | ({"target_compression_ratio": press.share} if press.share else {"target_size": press.tokens})


@dataclass
class DecodingCheck:
    tier: str
    jaccard: list[float]  # per layer
    compressions: int  # kvpress's compressions of layer 0 over the steps
    held: int  # tokens layer 0 holds at the end, ours
    held_kvpress: int
    kld: float
    kld_kvpress: float
    top1_pct: float
    top1_pct_kvpress: float

    @property
    def jaccard_min(self) -> float:
        return min(self.jaccard)


def reference_ids(loaded: LoadedModel, reference: dict) -> torch.Tensor:
    """(1, CONTEXT + STEPS + 1) the token ids the fixture was recorded on, checked against its first ones."""
    ids = loaded.tokenizer(reference_text(reference["text"]), return_tensors="pt").input_ids
    ids = ids[:, : reference["context"] + reference["decoded"] + 1]
    if ids[0, :8].tolist() != reference["ids_head"] or (reference["context"], reference["decoded"]) != (CONTEXT, STEPS):
        raise ValueError("the fixture was recorded on other tokens: re-run scripts/kvpress_reference.py --decoding")
    return ids.to(loaded.model.device)


@torch.inference_mode()
def _decoded(loaded: LoadedModel, cache, ids: torch.Tensor) -> torch.Tensor:
    """Prefill the context in one forward, then feed each later token alone: (STEPS, vocab) log-probs."""
    next_logits(loaded.model, ids[:, :CONTEXT], cache)
    out = [next_logits(loaded.model, ids[:, t : t + 1], cache)[0] for t in range(CONTEXT, ids.shape[1] - 1)]
    return torch.log_softmax(torch.stack(out), dim=-1)


def check_decoding(loaded: LoadedModel, reference: dict, tiers: tuple[str, ...] | None = None) -> list[DecodingCheck]:
    """Every decoding tier of the fixture (or those in `tiers`) in codeckv's cache beside kvpress's record (module
    docstring)."""
    ids = reference_ids(loaded, reference)
    seen = ids.shape[1] - 1
    native = _decoded(loaded, DynamicCache(config=loaded.model.config), ids)
    heads = loaded.info.num_kv_heads
    rows = []
    for name, recorded in reference["presses"].items():
        if tiers is not None and name not in tiers:
            continue
        spec = {key: recorded[key] for key in kvpress_spec(name)}
        if spec != kvpress_spec(name):
            raise ValueError(f"{name}'s press is not what the fixture recorded ({spec} vs {kvpress_spec(name)}): "
                             "re-run scripts/kvpress_reference.py --decoding")
        cache = make_cache(loaded, get_tier(name))
        got = _decoded(loaded, cache, ids)
        ours = []
        for layer in cache.layers:
            positions = layer.positions()[0].cpu()  # (H, held)
            ours.append(torch.zeros(heads, seen, dtype=torch.bool).scatter_(1, positions, True))
        theirs = [unpack(packed, heads, seen) for packed in recorded["kept"]]
        rows.append(DecodingCheck(
            name, [jaccard(a, b) for a, b in zip(ours, theirs, strict=True)], recorded["compressions"][0],
            int(cache.layers[0].positions().shape[2]), recorded["held"][0],
            float(kl_divergence(native, got).mean()), recorded["kld"],
            100 * float((got.argmax(-1) == native.argmax(-1)).double().mean()), recorded["top1_pct"]))
    return rows
