"""The texts quality is measured on, present on every machine: no download.

- "corpus" (the embedded NLL corpus, design.md): CPython's own Python reference topics,
  `from pydoc_data.topics import topics`, sorted by key and joined with blank lines.
- "docstrings" (the held-out text nobody tunes on): the docstrings of a fixed list of CPython
  standard-library modules and of their public classes and functions, gathered with inspect.getdoc.

Either, or any user text, is cut into token windows for the decode-NLL / KLD protocol.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from functools import lru_cache

import torch
from transformers import PreTrainedTokenizerBase

DOCSTRING_MODULES = (  # pure-Python standard-library modules with no side effects on import, in this order
    "abc", "argparse", "ast", "base64", "bisect", "calendar", "cmd", "codecs", "collections", "colorsys",
    "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "dis", "enum",
    "filecmp", "fnmatch", "fractions", "ftplib", "functools", "getopt", "gettext", "glob", "gzip", "heapq", "hmac",
    "imaplib", "inspect", "ipaddress", "json", "logging", "mailbox", "mimetypes", "numbers", "operator",
    "optparse", "pathlib", "pickle", "pkgutil", "poplib", "pprint", "queue", "quopri", "random", "re", "sched",
    "secrets", "selectors", "shelve", "shlex", "shutil", "smtplib", "socketserver", "statistics", "string",
    "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize", "trace",
    "traceback", "types", "typing", "unittest", "uuid", "warnings", "wave", "weakref", "zipfile",
)


@lru_cache(maxsize=1)
def corpus_text() -> str:
    """The Python reference topics, sorted by key, joined with blank lines."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


@lru_cache(maxsize=1)
def docstrings_text() -> str:
    """Docstrings of DOCSTRING_MODULES and of their public classes and functions, each once, in a fixed order."""
    seen, parts = set(), []
    for name in DOCSTRING_MODULES:
        module = importlib.import_module(name)
        with warnings.catch_warnings():  # e.g. typing.io: reading a deprecated alias warns
            warnings.simplefilter("ignore", DeprecationWarning)
            members = [getattr(module, attr) for attr in sorted(vars(module)) if not attr.startswith("_")]
        owned = [m for m in members if (inspect.isclass(m) or inspect.isfunction(m)) and m.__module__ == name]
        for obj in (module, *owned):
            doc = inspect.getdoc(obj)
            if doc and doc not in seen:
                seen.add(doc)
                parts.append(doc)
    return "\n\n".join(parts)


SOURCES = {"corpus": corpus_text, "docstrings": docstrings_text}


def source_text(source: str) -> str:
    """The text of a named source (SOURCES), or a ValueError listing them."""
    if source not in SOURCES:
        raise ValueError(f"unknown text source {source!r} (allowed: {', '.join(SOURCES)})")
    return SOURCES[source]()


def text_windows(tokenizer: PreTrainedTokenizerBase, text: str, windows: int, length: int, name: str = "the text"):
    """The first `windows` consecutive, non-overlapping windows of `length` tokens of `text` -> (windows, length)."""
    if windows < 1 or length < 4:
        raise ValueError(f"need at least 1 window of at least 4 tokens, got {windows} x {length}")
    ids = tokenizer(text, return_tensors="pt").input_ids[0]
    if ids.numel() < windows * length:
        raise ValueError(
            f"{name} has {ids.numel()} tokens, fewer than {windows} windows of {length}: "
            f"use fewer or shorter windows (at most {ids.numel() // length} of {length})"
        )
    return ids[: windows * length].view(windows, length)


def corpus_windows(tokenizer: PreTrainedTokenizerBase, windows: int, length: int) -> torch.Tensor:
    """The first `windows` windows of `length` tokens of the embedded corpus -> (windows, length)."""
    return text_windows(tokenizer, corpus_text(), windows, length, "the corpus")
