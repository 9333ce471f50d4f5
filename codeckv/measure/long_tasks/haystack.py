"""What the long-context tasks draw from: haystacks, word lists and random values, as RULER draws them.

- noise: RULER's repeated sentence (the one of the pass-key test, measure/needle.py);
- essay: the words of a long text, read from its start and repeated if too short, split into sentences. RULER
  reads Paul Graham's essays, a download; here the text is chosen (`haystack_text`): an embedded one (the King
  James Bible by default, prose; the Python reference topics; the stdlib docstrings), or a user's UTF-8 file;
- words: adjective-noun keys and the word lists of wonderwords, the package RULER draws its words from;
- values: 7-digit numbers, version-4 UUIDs from the sample's generator.
"""

from __future__ import annotations

import importlib.resources
import random
import re
import uuid
from functools import lru_cache
from pathlib import Path

from codeckv.corpus import SOURCES, source_text

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
DEFAULT_HAYSTACK = "bible"
MAX_HAYSTACK_BYTES = 64 * 2**20  # a user's file: read whole, so bounded
MIN_HAYSTACK_WORDS = 200
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@lru_cache(maxsize=4)
def haystack_text(haystack: str = DEFAULT_HAYSTACK) -> str:
    """The essay haystack: an embedded text by name (codeckv.corpus.SOURCES) or the path of a UTF-8 text file."""
    if haystack in SOURCES:
        return source_text(haystack)
    path = Path(haystack)
    if not path.is_file():
        raise ValueError(f"haystack {haystack!r} is neither an embedded text ({', '.join(SOURCES)}) nor a file")
    if path.stat().st_size > MAX_HAYSTACK_BYTES:
        raise ValueError(f"haystack file {path} is {path.stat().st_size:,} bytes; at most {MAX_HAYSTACK_BYTES:,}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"haystack file {path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    if len(text.split()) < MIN_HAYSTACK_WORDS:
        raise ValueError(f"haystack file {path} has {len(text.split())} words; at least {MIN_HAYSTACK_WORDS}")
    return text


@lru_cache(maxsize=4)
def _essay_words(text: str) -> tuple[str, ...]:
    return tuple(re.sub(r"\s+", " ", text).strip().split(" "))


def essay_sentences(text: str, words: int) -> list[str]:
    """The first `words` words of `text` (repeated from its start if it has fewer), split into sentences."""
    every = _essay_words(text)
    repeats = -(-words // len(every))
    return SENTENCE_END.split(" ".join((every * repeats)[:words]).strip())


def _wordlist(name: str) -> list[str]:
    text = importlib.resources.files("wonderwords").joinpath("assets", name).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


@lru_cache(maxsize=1)
def _key_parts() -> tuple[tuple[str, ...], tuple[str, ...]]:
    return tuple(sorted(set(_wordlist("adjectivelist.txt")))), tuple(sorted(set(_wordlist("nounlist.txt"))))


def key_word(rng: random.Random) -> str:
    """RULER's needle key: an adjective-noun pair of wonderwords' lists, uniform over the pairs (RULER lists all
    6 million of them; drawing each half is the same draw without building the list)."""
    adjectives, nouns = _key_parts()
    return f"{rng.choice(adjectives)}-{rng.choice(nouns)}"


@lru_cache(maxsize=1)
def plain_words() -> tuple[str, ...]:
    """RULER's common-words vocabulary: wonderwords' nouns, adjectives and verbs, each once, sorted."""
    return tuple(sorted(set(_wordlist("nounlist.txt") + _wordlist("adjectivelist.txt") + _wordlist("verblist.txt"))))


def random_value(rng: random.Random, kind: str) -> str:
    """A needle's key or value: "numbers" (7 digits), "words" (an adjective-noun key) or "uuids"."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        return key_word(rng)
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"unknown needle type {kind!r} (allowed: numbers, words, uuids)")
