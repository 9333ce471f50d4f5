"""The size a PCA tier stores on texts far from its calibration text: the rate control's budget, measured.

    rows = pca_size_table(loaded, ["pca-8x", "pca-16x"], texts=["code", "numbers"])

Each text's first `length` tokens go through a fresh cache of each tier: `prefill` tokens in one forward
(one flush of many chunks), then the rest one token at a time (a flush per chunk, as decoding archives).
Per row: the archive as the footprint counts it (everything stored, raw tail included) and the archived
chunks alone against bf16, the tier's budget, the worst running share the layers together reached at a
chunk boundary once the sink is paid back (codecs/rate.py: each layer keeps within its share of the budget,
codeckv.cache.calibration.budget_shares, so the layers together never exceed it), the worst share one layer
reached against the tier's budget (its share: above or below 1),
and how the chunks' steps were spread (mean step over the calibrated one, share of skipped chunks).

The texts (SIZE_TEXTS), all on every machine: the corpus and the held-out docstrings; code (the source of
standard-library modules); numbers; text in other languages (MULTILINGUAL, written here); one token repeated.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from codeckv.cache import make_cache
from codeckv.cache.pca_layer import PCALayer
from codeckv.codecs.rate import LADDER, REPAY_TOKENS, RUNGS_PER_OCTAVE, SKIP
from codeckv.corpus import bible_text, corpus_text, docstrings_text, text_windows
from codeckv.loaded import LoadedModel
from codeckv.tiers import Tier

MULTILINGUAL = (
    "Die Kompression des Zwischenspeichers eines Sprachmodells spart Speicher, kostet aber Genauigkeit. Jede "
    "Schicht speichert Schlüssel und Werte für jedes Token, und bei langen Texten wächst dieser Speicher linear "
    "mit der Länge des Kontexts. "
    "La compression du cache d'un modèle de langue économise de la mémoire, mais elle coûte de la précision. "
    "Chaque couche garde les clés et les valeurs de chaque jeton, et pour de longs documents cette mémoire croît "
    "avec la longueur du contexte. "
    "Сжатие кэша языковой модели экономит память, но стоит точности. Каждый слой хранит ключи и значения для "
    "каждого токена, и для длинных текстов эта память растёт линейно с длиной контекста. "
    "语言模型的缓存压缩可以节省内存，但会损失精度。每一层都为每个词元保存键和值，对于长文本，这部分内存随上下文长度线性增长。"
    "言語モデルのキャッシュを圧縮するとメモリを節約できますが、精度が下がります。各層はトークンごとにキーと値を保存し、"
    "長い文章ではこのメモリが文脈の長さに比例して増えます。"
)
CODE_MODULES = ("textwrap", "heapq", "bisect", "fractions")


def _code() -> str:
    """The source of CODE_MODULES (standard library), one after the other."""
    import importlib

    return "\n\n".join(inspect.getsource(importlib.import_module(name)) for name in CODE_MODULES)


def _numbers() -> str:
    """Pseudo-random numbers, as a table of floats and integers (seeded: the same text on every machine)."""
    rng = random.Random(0)
    return "\n".join(f"{rng.random():.6f}, {rng.randint(0, 10**6)}, {rng.gauss(0, 100):.3f}" for _ in range(400))


SIZE_TEXTS: dict[str, Callable[[], str]] = {
    "corpus": corpus_text,
    "docstrings": docstrings_text,
    "bible": lambda: bible_text()[:200_000],  # Genesis and Exodus: prose far from Python's documentation
    "code": _code,
    "numbers": _numbers,
    "multilingual": lambda: "\n\n".join([MULTILINGUAL] * 4),
    "repeated": lambda: " the" * 2048,
}


@dataclass
class PCASizeRow:
    tier: str
    text: str
    tokens: int
    archived_tokens: int
    archive_pct: float  # footprint archive bytes (chunks + raw tail) / bf16 of every token, %
    chunks_pct: float  # bytes of the archived chunks / bf16 of the archived tokens, %
    budget_pct: float  # the tier's bits per element / 16, %
    worst_boundary_pct: float  # largest running chunks_pct of all layers together at a boundary from REPAY_TOKENS on
    worst_layer_pct: float  # the same for the layer that spent the most (its share may be above the budget)
    mean_step: float  # the chunks' mean step / the calibrated step (coded chunks)
    skipped_pct: float  # chunks stored without codes, %


def pca_size_table(loaded: LoadedModel, tiers: list[Tier], texts: list[str] | None = None, length: int = 512,
                   prefill: int = 384, progress: Callable[[str], None] | None = None) -> list[PCASizeRow]:
    """One row per (tier, text) (module docstring); texts: names of SIZE_TEXTS (default: all)."""
    texts = list(SIZE_TEXTS) if texts is None else texts
    unknown = [t for t in texts if t not in SIZE_TEXTS]
    if unknown:
        raise ValueError(f"unknown texts {unknown} (allowed: {', '.join(SIZE_TEXTS)})")
    if not 0 < prefill <= length:
        raise ValueError(f"prefill={prefill} must be in 1..length={length}")
    if any(t.joint is None for t in tiers):
        raise ValueError("pca-size measures PCA tiers only (allowed: tiers with a joint coder, e.g. pca-8x)")
    rows = []
    for text in texts:
        ids = text_windows(loaded.tokenizer, SIZE_TEXTS[text](), 1, length, text).to(loaded.model.device)
        for tier in tiers:
            rows.append(_measure(loaded, tier, text, ids, prefill))
            if progress:
                progress(f"{tier.name} on {text}")
    return rows


@torch.inference_mode()
def _measure(loaded: LoadedModel, tier, text: str, ids: torch.Tensor, prefill: int) -> PCASizeRow:
    """Fill a fresh cache of `tier` with ids (prefill, then one token at a time) and read its chunks."""
    cache = make_cache(loaded, tier)
    loaded.model(ids[:, :prefill], cache=cache)
    for t in range(prefill, ids.shape[1]):
        loaded.model(ids[:, t : t + 1], cache=cache)
    fp = cache.footprint()
    layers = [layer for layer in cache.layers if isinstance(layer, PCALayer)]
    chunks = [c for layer in layers for c in layer.chunks]
    coded = [c.rung for c in chunks if c.rung != SKIP]
    bf16_token = fp.bf16_bytes / fp.tokens / len(layers)  # one layer's bf16 bytes per token
    running = torch.tensor([[c.nbytes for c in layer.chunks] for layer in layers], dtype=torch.float64).cumsum(1)
    tokens = torch.arange(1, running.shape[1] + 1) * layers[0].unit  # every layer archives the same tokens
    paid = tokens >= REPAY_TOKENS
    together = running.sum(0) / (tokens * bf16_token * len(layers))
    alone = running / (tokens * bf16_token)
    worst, worst_layer = (float(x[..., paid].max()) if paid.any() else 0.0 for x in (together, alone))
    return PCASizeRow(
        tier.name, text, fp.tokens, fp.archived_tokens, 100 * fp.ratio, 100 * fp.steady_state_ratio,
        100 * tier.joint.bits_per_element / 16, 100 * worst, 100 * worst_layer,
        sum(2 ** (LADDER[r] / RUNGS_PER_OCTAVE) for r in coded) / max(len(coded), 1),
        100 * (len(chunks) - len(coded)) / max(len(chunks), 1),
    )
