"""Frequent words extraction (fwe), as RULER's scripts/data/synthetic/freq_words_extraction.py builds it: aggregation.

A text of coded words (6 random lowercase letters) whose counts follow a zeta distribution (alpha 2): the word of
rank k appears size * k^-2 / zeta(2) times. The most frequent is written "..." (noise the question says to ignore);
the answer must name the next three. The vocabulary has (length - answer budget) / 50 words, as in RULER. A
haystack's size counts the words the distribution is scaled to.
"""

from __future__ import annotations

import math
import random
import string

from codeckv.measure.long_tasks.base import LongTask, TaskText

INSTRUCTION = ("Read the following coded text and track the frequency of each coded word. Find the three most "
               "frequently appeared coded words. ")
QUESTION = ("\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three most "
            "frequently appeared words in the above coded text?")
ANSWER_PREFIX = "Answer: According to the coded text above, the three most frequently appeared words are:"
ALPHA = 2.0
WORD_LETTERS = 6
ANSWER_TOKENS = 50
TOKENS_PER_WORD_TYPE = 50  # RULER's vocabulary: one coded word per 50 tokens of the prompt


def zeta(alpha: float, terms: int = 10_000) -> float:
    """Riemann zeta(alpha) for alpha > 1: the partial sum and its Euler-Maclaurin tail (error below 1e-12 here)."""
    if alpha <= 1:
        raise ValueError(f"alpha={alpha} must exceed 1")
    partial = math.fsum(k**-alpha for k in range(1, terms))
    return partial + terms ** (1 - alpha) / (alpha - 1) + terms**-alpha / 2


def generate(rng: random.Random, size: int, essay: str, vocabulary: int) -> TaskText:
    """An instance scaled to `size` words over `vocabulary` coded words."""
    words: set[str] = set()
    while len(words) < vocabulary:
        words.add("".join(rng.choices(string.ascii_lowercase, k=WORD_LETTERS)))
    ranked = sorted(words)
    rng.shuffle(ranked)
    ranked[0] = "..."  # the most frequent: noise
    norm = zeta(ALPHA)
    text = [word for rank, word in enumerate(ranked, 1) for _ in range(int(size * rank**-ALPHA / norm))]
    rng.shuffle(text)
    return TaskText(INSTRUCTION + " ".join(text), QUESTION, ANSWER_PREFIX, tuple(ranked[1:4]))


def task_for(length: int) -> LongTask:
    """fwe at `length` tokens (its vocabulary grows with the length, as in RULER)."""
    vocabulary = max(8, (length - ANSWER_TOKENS) // TOKENS_PER_WORD_TYPE)

    def made(rng: random.Random, size: int, essay: str) -> TaskText:
        return generate(rng, size, essay, vocabulary)

    # the 4th word (rank 4) appears size / (16 zeta(2)) times: at least once from 27 words on
    return LongTask("fwe", "the 3 most frequent coded words of a zeta-distributed text", ANSWER_TOKENS, made,
                    smallest=27)
