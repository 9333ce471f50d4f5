"""Common words extraction (cwe), as RULER's scripts/data/synthetic/common_words_extraction.py builds it: aggregation.

A numbered list of words in which 10 words appear often (30 times each) and the rest rarely (3 times each); the
answer must name the 10 common ones. Below 4,096 tokens RULER repeats them 6 and 1 times and its worked example is
smaller (20 words, 3 and 1 times) than above (40 words, 10 and 3). One worked example opens the prompt, its answer
given. Words come from wonderwords' lists, as in RULER. A haystack's size counts the distinct words.
"""

from __future__ import annotations

import random

from codeckv.measure.long_tasks.base import LongTask, TaskText
from codeckv.measure.long_tasks.haystack import plain_words

INSTRUCTION = ("Below is a numbered list of words. In these words, some appear more often than others. "
               "Memorize the ones that appear most often.\n")
QUESTION = "\nQuestion: What are the 10 most common words in the above list?"
ANSWER_PREFIX = "Answer: The top 10 words that appear most often in the list are:"
COMMON = 10
ANSWER_TOKENS = 120
SHORT = 4096  # below this length RULER uses the smaller repeats


def _numbered(words: list[str]) -> str:
    return " ".join(f"{i + 1}. {word}" for i, word in enumerate(words))


def _example(rng: random.Random, distinct: int, common_repeats: int, rare_repeats: int) -> tuple[str, list[str]]:
    """(the numbered list, its common words)."""
    if distinct > len(plain_words()):
        raise ValueError(f"cwe draws {distinct} distinct words; the word list has {len(plain_words())}")
    chosen = rng.sample(plain_words(), distinct)
    common, rare = chosen[:COMMON], chosen[COMMON:]
    listed = common * common_repeats + rare * rare_repeats
    rng.shuffle(listed)
    return _numbered(listed), common


def generate(rng: random.Random, size: int, essay: str, short: bool) -> TaskText:
    """An instance of `size` distinct words (`short`: RULER's repeats below 4,096 tokens)."""
    shape = ((20, 3, 1), (size, 6, 1)) if short else ((40, 10, 3), (size, 30, 3))
    example_list, example_common = _example(rng, *shape[0])
    example = INSTRUCTION + example_list + QUESTION + " " + ANSWER_PREFIX + " " + _numbered(example_common) + "\n"
    listed, common = _example(rng, *shape[1])
    return TaskText(example + INSTRUCTION + listed, QUESTION, ANSWER_PREFIX, tuple(common))


def task_for(length: int) -> LongTask:
    """cwe at `length` tokens (its repeats depend on the length, as in RULER)."""
    short = length < SHORT

    def made(rng: random.Random, size: int, essay: str) -> TaskText:
        return generate(rng, size, essay, short)

    return LongTask("cwe", "the 10 most frequent words of a long numbered list", ANSWER_TOKENS, made,
                    smallest=COMMON + 1)
