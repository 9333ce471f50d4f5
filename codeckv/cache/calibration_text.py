"""What every calibration of codeckv reads and where it is kept: the calibration text and the folder.

    ids = calibration_windows(loaded.tokenizer, 32, 512)     # (32, 512) token ids no quality window reads
    calibration_dir()                                         # $CODECKV_CACHE/calibration

The PCA tiers' coders (cache/calibration.py) and FP8's static scales (cache/kv_scales.py) are both computed on this
text: half its windows the last tokens of the embedded corpus, half chapters spread over the King James Bible's New
Testament (codeckv/corpus.py). Quality windows read a text from its start (the corpus, the Bible from Genesis) and
the held-out docstrings are never read, so no tier is measured on its calibration text.
"""

from __future__ import annotations

from pathlib import Path

import torch

from codeckv.corpus import bible_held_out_text, corpus_text, leading_tokens
from codeckv.paths import cache_dir


def calibration_dir() -> Path:
    """Where calibrations live: $CODECKV_CACHE/calibration."""
    return cache_dir() / "calibration"


def calibration_windows(tokenizer, windows: int, length: int) -> torch.Tensor:
    """(windows, length) token ids, the calibration text: the first ceil(windows / 2) the last tokens of the embedded
    corpus, the others each the start of a chapter of the Bible's New Testament (corpus.bible_held_out_text), the
    chapters found at even spacing through it."""
    from_corpus, from_bible = (windows + 1) // 2, windows // 2
    ids = tokenizer(corpus_text(), return_tensors="pt").input_ids[0]
    if ids.numel() < 2 * from_corpus * length:
        raise ValueError(f"the corpus has {ids.numel()} tokens: too few for {from_corpus} calibration windows of "
                         f"{length} tokens apart from the quality windows (allowed: at most {ids.numel() // 2})")
    corpus = ids[ids.numel() - from_corpus * length :].view(from_corpus, length)
    bible = bible_held_out_text()
    starts = [bible.index("\n\n", i * len(bible) // from_bible) + 2 if i else 0 for i in range(from_bible)]
    chapters = [leading_tokens(tokenizer, bible[start:], length)[:length] for start in starts]
    return torch.cat([corpus, *(chapter[None] for chapter in chapters)])
