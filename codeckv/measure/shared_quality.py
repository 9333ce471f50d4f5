"""Quality rows from one native prefill per window: every tier built from it, under the "once" protocol.

    run = shared_quality(loaded, [TIERS["snapkv-50"], get_tier("snapkv-875+turbo-4")], windows=4, length=1280,
                         prefix=1024)     # the same QualityRun as measure_quality's, on the same windows

measure_quality (measure/lockstep.py) feeds every cache its window token by token, a prefill per cache. Under the
"once" protocol a tier's cache after the prefix is a function of the native prefill (measure/shared_prefill.py), so
here each window's prefix is prefilled natively once and each tier's cache built from it; then the scored tokens are
teacher-forced: in one forward for a cache that keeps new tokens raw (native, a press alone: nothing pressed after
the prefix, so the causal mask makes it the same computation as one token at a time, up to the rounding of the
matrix products at another shape), one at a time for a cache that codes them (a codec archives each unit as it
completes, and the tokens after it read the archive). Peers and llama.cpp's types are measure_quality's alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from codeckv.corpus import source_text, text_windows
from codeckv.loaded import LoadedModel
from codeckv.measure.lockstep import Reference, Scores, kl_divergence
from codeckv.measure.quality import QualityRun, quality_row
from codeckv.measure.shared_prefill import shared_prefill
from codeckv.tiers import TIERS, Tier

Progress = Callable[[int, int, str], None]  # (tier caches done, in all, message); may raise to stop


@torch.inference_mode()
def _score(loaded: LoadedModel, cache, scored: torch.Tensor, one_forward: bool) -> torch.Tensor:
    """Feed `scored` (1, n) through a cache holding the prefix: (n, vocab) fp32 log-probs after each token."""
    model = loaded.model
    if one_forward:
        return torch.log_softmax(model(input_ids=scored, cache=cache, use_cache=True).logits[0].float(), dim=-1)
    steps = [model(input_ids=scored[:, i : i + 1], cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
             for i in range(scored.shape[1])]
    return torch.log_softmax(torch.stack(steps).float(), dim=-1)


def shared_quality(
    loaded: LoadedModel,
    tiers: list[Tier],
    windows: int = 4,
    length: int = 1280,
    prefix: int = 1024,
    source: str = "corpus",
    text: str | None = None,
    progress: Progress | None = None,
) -> QualityRun:
    """Native and every tier on `windows` windows of `length` tokens, each window's first `prefix` prefilled once."""
    if not tiers:
        raise ValueError("choose at least one tier")
    if not 1 <= prefix <= length - 1:
        raise ValueError(f"prefix={prefix} must leave scored tokens in a window of {length} (allowed: 1..{length - 1})")
    label = "text" if text is not None else source
    data = text_windows(loaded.tokenizer, text if text is not None else source_text(source), windows, length + 1,
                        "the text" if text is not None else f"the {source}")
    runs = [TIERS["native"], *(t for t in tiers if not t.is_native)]
    native, metrics, caches = [], {t.name: [] for t in runs}, {}  # metrics: per window (nll, kld, top1)
    total, done = windows * len(runs), 0
    for w in range(windows):
        ids = data[w : w + 1].to(loaded.model.device)
        target = data[w, prefix + 1 :, None]
        prefill = shared_prefill(loaded, ids[:, :prefix])
        for tier in runs:
            cache = prefill.cache_for(tier, materialization_free=False)  # archiving from its first unit (raw_until=0)
            got = _score(loaded, cache, ids[:, prefix:-1], not tier.coded).cpu()  # (positions, vocab)
            if tier.is_native:
                native.append(got)
            metrics[tier.name].append((-got.gather(-1, target).squeeze(-1), kl_divergence(native[w], got),
                                       got.argmax(-1) == native[w].argmax(-1)))
            caches.setdefault(tier.name, cache)  # a row's bytes are per window: every window holds as many tokens
            done += 1
            if progress:
                progress(done, total, f"window {w + 1}/{windows}: {tier.name}")
        del prefill
    logprobs = torch.stack(native)  # (W, positions, vocab)
    targets = data[:, prefix + 1 :]
    reference = Reference(data.cpu(), prefix, logprobs, -logprobs.gather(-1, targets[..., None]).squeeze(-1))
    scores = {name: Scores(*(torch.stack(parts) for parts in zip(*per_window))) for name, per_window in metrics.items()}
    rows = [quality_row(tier, reference, scores[tier.name], caches[tier.name], label, length, "once", rows=1)
            for tier in runs]  # each tier's cache holds one window
    tokens = [loaded.tokenizer.decode([t]) for t in reference.targets[0].tolist()]
    return QualityRun(rows, reference, scores, tokens)
