"""The embedded NLL corpus: CPython's own Python reference topics, present on every machine.

`from pydoc_data.topics import topics`, sorted by key and joined with blank lines
(design.md), cut into token windows for the decode-NLL protocol.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from transformers import PreTrainedTokenizerBase


@lru_cache(maxsize=1)
def corpus_text() -> str:
    """The Python reference topics, sorted by key, joined with blank lines."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def corpus_windows(tokenizer: PreTrainedTokenizerBase, windows: int, length: int) -> torch.Tensor:
    """The first `windows` consecutive, non-overlapping windows of `length` tokens -> (windows, length)."""
    ids = tokenizer(corpus_text(), return_tensors="pt").input_ids[0]
    if ids.numel() < windows * length:
        raise ValueError(f"the corpus has {ids.numel()} tokens, fewer than {windows} windows of {length}")
    return ids[: windows * length].view(windows, length)
