"""Each press against kvpress's own: the positions it keeps and how far it moves the model, on the same tokens.

    reference = load_reference(Path("assets/kvpress-reference/smollm2-135m.json"))   # scripts/kvpress_reference.py
    rows = check_presses(loaded, reference)          # KvpressCheck per press and ratio
    rows[0].jaccard_min, rows[0].kld, rows[0].kld_kvpress

The protocol is kvpress's (the context pressed once, "once" in codeckv/presses/base.py): the first CONTEXT tokens of
the text are prefilled into a fresh cache in one forward, each layer pressed after its attention; then the next
DECODED tokens are teacher-forced and their next-token distributions compared with native's (KL(native || pressed),
top-1). kvpress's side (scripts/kvpress_worker.py) feeds them one at a time; here they go in one forward, which
attends exactly as single steps do (causal mask, nothing pressed after the context) up to float rounding, and the
context is prefilled once for every press (measure/shared_prefill.py: each press then scores the captured queries,
as it would in its own prefill, which tests/measure/test_shared_prefill.py checks). Kept
positions are compared per layer: Jaccard = |ours ∩ kvpress's| / |ours ∪ kvpress's| over (KV head, position) pairs.
The texts are licences as Debian ships them (/usr/share/common-licenses/): the GNU GPL version 3 (the fixtures
<model>.json) and the Mozilla Public License 1.1 (<model>-MPL-1.1.json), prose of another domain than the corpus, on
every Debian machine. A fixture names its text.
"""

from __future__ import annotations

import base64
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from codeckv.loaded import LoadedModel
from codeckv.measure.lockstep import kl_divergence
from codeckv.measure.shared_prefill import shared_prefill
from codeckv.tiers import get_tier, ratio_tag

CONTEXT, DECODED = 1024, 128  # tokens pressed once, tokens teacher-forced after them
LICENCES = Path("/usr/share/common-licenses")
REFERENCE_TEXT = LICENCES / "GPL-3"  # the default text
FIXTURES = Path(__file__).resolve().parents[2] / "assets" / "kvpress-reference"
REFERENCE_PRESSES = {"streamingllm": "StreamingLLMPress", "snapkv": "SnapKVPress", "knorm": "KnormPress",
                     "tova": "TOVAPress", "expected": "ExpectedAttentionPress"}  # codeckv name -> kvpress class


def reference_text(name: str = REFERENCE_TEXT.name) -> str:
    """The licence text `name` (of /usr/share/common-licenses) a reference is recorded on; a clear error where the
    file is missing."""
    path = LICENCES / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing (Debian's base-files ships it): the kvpress reference is recorded "
                                "on that text")
    return path.read_text()


@dataclass
class KvpressCheck:
    """One press at one ratio, ours beside kvpress's."""

    press: str
    ratio: float
    jaccard: list[float]  # per layer
    kld: float  # ours, against our native on the same tokens
    kld_kvpress: float  # kvpress's, against its native
    top1_pct: float
    top1_pct_kvpress: float
    sinks_kept: bool  # every KV head of every layer kept positions 0..3

    @property
    def jaccard_min(self) -> float:
        return min(self.jaccard)

    @property
    def jaccard_mean(self) -> float:
        return sum(self.jaccard) / len(self.jaccard)


def load_reference(path: Path) -> dict:
    """A fixture written by scripts/kvpress_reference.py."""
    return json.loads(Path(path).read_text())


def unpack(packed: str, heads: int, length: int) -> torch.Tensor:
    """(H, length) bool mask of one layer's kept positions from the fixture's base64(zlib(packbits))."""
    bits = np.unpackbits(np.frombuffer(zlib.decompress(base64.b64decode(packed)), dtype=np.uint8))
    return torch.from_numpy(bits[: heads * length].reshape(heads, length).astype(bool))


def _kept_masks(cache, length: int) -> list[torch.Tensor]:
    """(H, length) bool mask per layer of the context positions a pressed cache holds (batch row 0)."""
    masks = []
    for layer in cache.layers:
        positions = layer.positions()[0]  # (H, held)
        mask = torch.zeros(positions.shape[0], length, dtype=torch.bool)
        mask.scatter_(1, positions[positions < length].view(positions.shape[0], -1).cpu(), True)
        masks.append(mask)
    return masks


def jaccard(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """|A ∩ B| / |A ∪ B| of two bool masks (1.0 when both are empty)."""
    union = int((ours | theirs).sum())
    return int((ours & theirs).sum()) / union if union else 1.0


@torch.inference_mode()
def _logprobs(loaded: LoadedModel, cache, ids: torch.Tensor) -> torch.Tensor:
    """Feed the tokens after the context through a cache holding it, in one forward: (DECODED, vocab) fp32
    log-probs predicting ids[CONTEXT + 1 :]."""
    logits = loaded.model(input_ids=ids[:, CONTEXT:-1], cache=cache, use_cache=True).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def reference_ids(loaded: LoadedModel, reference: dict) -> torch.Tensor:
    """(1, CONTEXT + DECODED) the token ids the fixture was recorded on, checked against its first ones."""
    text = reference_text(reference.get("text", REFERENCE_TEXT.name))
    ids = loaded.tokenizer(text, return_tensors="pt").input_ids[:, : reference["context"] + 1 +
                                                                              reference["decoded"]]
    if ids[0, :8].tolist() != reference["ids_head"] or reference["context"] != CONTEXT:
        raise ValueError("the fixture was recorded on other tokens: re-run scripts/kvpress_reference.py")
    return ids.to(loaded.model.device)


def check_presses(loaded: LoadedModel, reference: dict, presses: list[str] | None = None,
                  ratios: list[float] | None = None) -> list[KvpressCheck]:
    """Every press and ratio of the fixture (or those asked) in codeckv's cache beside kvpress's record."""
    ids = reference_ids(loaded, reference)
    prefill = shared_prefill(loaded, ids[:, :CONTEXT])
    native = _logprobs(loaded, prefill.cache_for(get_tier("native")), ids)
    heads = loaded.info.num_kv_heads
    rows = []
    for name, by_ratio in reference["presses"].items():
        if presses and name not in presses:
            continue
        for ratio_text, recorded in by_ratio.items():
            ratio = float(ratio_text)
            if ratios and ratio not in ratios:
                continue
            cache = prefill.cache_for(get_tier(f"{name}-{ratio_tag(ratio)}"))
            got = _logprobs(loaded, cache, ids)
            ours = _kept_masks(cache, CONTEXT)
            theirs = [unpack(packed, heads, CONTEXT) for packed in recorded["kept"]]
            rows.append(KvpressCheck(
                press=name, ratio=ratio, jaccard=[jaccard(a, b) for a, b in zip(ours, theirs, strict=True)],
                kld=float(kl_divergence(native, got).mean()), kld_kvpress=recorded["kld"],
                top1_pct=100 * float((got.argmax(-1) == native.argmax(-1)).double().mean()),
                top1_pct_kvpress=recorded["top1_pct"], sinks_kept=all(bool(m[:, :4].all()) for m in ours)))
    return rows
