"""Needle in a haystack, RULER's eight variants (scripts/data/synthetic/niah.py and synthetic.yaml of NVIDIA/RULER).

Needles "One of the special magic {values} for {key} is: {value}." are hidden in a haystack; the question asks the
values of one key (or of several, multiquery) and the answer must contain every one of them.

| task | haystack | key | value | keys | values per key | keys asked |
|---|---|---|---|---:|---:|---:|
| niah_single_1 | noise | word | number | 1 | 1 | 1 |
| niah_single_2 | essay | word | number | 1 | 1 | 1 |
| niah_single_3 | essay | word | uuid | 1 | 1 | 1 |
| niah_multikey_1 | essay | word | number | 4 (3 distractors) | 1 | 1 |
| niah_multikey_2 | needles | word | number | 1 among the haystack's | 1 | 1 |
| niah_multikey_3 | needles | uuid | uuid | 1 among the haystack's | 1 | 1 |
| niah_multivalue | essay | word | number | 1 | 4 | 1 |
| niah_multiquery | essay | word | number | 4 | 1 | 4 |

As RULER places them: in an essay the needles go between sentences at depths drawn from 40 evenly spaced ones
(0-100%); in noise or needles, at random lines. A haystack's size counts its words (essay) or lines (the others).
With one value asked, the template speaks in the singular, as RULER's does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import partial

from codeckv.measure.long_tasks.base import LongTask, TaskText
from codeckv.measure.long_tasks.haystack import NOISE, essay_sentences, random_value

INSTRUCTION = ("Some special magic {kind} are hidden within the following text. Make sure to memorize it. "
               "I will quiz you about the {kind} afterwards.\n")
QUESTION = "\nWhat are all the special magic {kind} for {query} mentioned in the provided text?"
ANSWER_PREFIX = "The special magic {kind} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic {kind} for {key} is: {value}."
DEPTHS = [round(100 * i / 39) for i in range(40)]  # RULER's np.linspace(0, 100, 40) rounded
ANSWER_TOKENS = 128


@dataclass(frozen=True)
class Niah:
    haystack: str  # "noise", "essay" or "needle"
    key: str  # "words" or "uuids"
    value: str  # "numbers" or "uuids"
    keys: int = 1
    values: int = 1
    queries: int = 1


def _singular(text: str) -> str:
    """RULER's rewording when one value is asked for."""
    return text.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")


def generate(config: Niah, rng: random.Random, size: int, essay: str) -> TaskText:
    """An instance with a haystack of `size` words (essay) or lines (noise, needles)."""
    kind = config.value
    keys, values, needles = [], [], []
    for _ in range(max(config.keys, config.queries)):
        keys.append(random_value(rng, config.key))
        values.append([random_value(rng, config.value) for _ in range(config.values)])
        needles += [NEEDLE.format(kind=kind, key=keys[-1], value=value) for value in values[-1]]
    rng.shuffle(needles)
    if config.haystack == "essay":
        sentences = essay_sentences(essay, size)
        cuts = [0] + sorted(len(sentences) * depth // 100 for depth in rng.sample(DEPTHS, len(needles)))
        parts = []
        for needle, lo, hi in zip(needles, cuts[:-1], cuts[1:], strict=True):
            parts += [" ".join(sentences[lo:hi]), needle]
        parts.append(" ".join(sentences[cuts[-1]:]))
        context = " ".join(part for part in parts if part)
    else:
        if config.haystack == "noise":
            lines = [NOISE] * size
        else:
            lines = [NEEDLE.format(kind=kind, key=random_value(rng, config.key), value=random_value(rng, config.value))
                     for _ in range(size)]
        for at, needle in zip(sorted(rng.sample(range(size), len(needles)), reverse=True), needles, strict=True):
            lines.insert(at, needle)
        context = "\n".join(lines)
    asked = rng.sample(range(len(keys)), config.queries)
    query = keys[asked[0]] if len(asked) == 1 else ", ".join(keys[i] for i in asked[:-1]) + ", and " + keys[asked[-1]]
    outputs = tuple(value for i in asked for value in values[i])
    instruction, question, prefix = INSTRUCTION, QUESTION, ANSWER_PREFIX
    if len(outputs) == 1:
        kind = kind[:-1]
        instruction, question, prefix = _singular(instruction), _singular(question), _singular(prefix)
    return TaskText(instruction.format(kind=kind) + context, question.format(kind=kind, query=query),
                    prefix.format(kind=kind, query=query), outputs)


VARIANTS = {
    "niah_single_1": (Niah("noise", "words", "numbers"), "one number under one key, in repeated noise"),
    "niah_single_2": (Niah("essay", "words", "numbers"), "one number under one key, in an essay"),
    "niah_single_3": (Niah("essay", "words", "uuids"), "one UUID under one key, in an essay"),
    "niah_multikey_1": (Niah("essay", "words", "numbers", keys=4), "one key's number among 3 distractor needles"),
    "niah_multikey_2": (Niah("needle", "words", "numbers"), "one key's number in a haystack made of needles"),
    "niah_multikey_3": (Niah("needle", "uuids", "uuids"), "one UUID key's UUID in a haystack of UUID needles"),
    "niah_multivalue": (Niah("essay", "words", "numbers", values=4), "all 4 numbers under one key"),
    "niah_multiquery": (Niah("essay", "words", "numbers", keys=4, queries=4), "the numbers of 4 keys at once"),
}

TASKS = {name: LongTask(name, tests, ANSWER_TOKENS, partial(generate, config),
                        smallest=max(config.keys, config.queries) * config.values + 1)
         for name, (config, tests) in VARIANTS.items()}
