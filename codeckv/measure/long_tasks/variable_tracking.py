"""Variable tracking (vt), as RULER's scripts/data/synthetic/variable_tracking.py builds it: multi-hop tracing.

A chain of assignments "VAR AAAAA = 12345", "VAR BBBBB = VAR AAAAA ", ... (1 chain, 4 hops: 5 variables of 5 capital
letters) is scattered in order among noise lines; the question asks every variable that holds the number, and the
answer must name all 5. As RULER's does, the prompt opens with one worked example (3-letter variables, its answer
given) small enough for 500 tokens. A haystack's size counts noise lines.
"""

from __future__ import annotations

import random
import string

from codeckv.measure.long_tasks.base import LongTask, TaskText
from codeckv.measure.long_tasks.haystack import NOISE

INSTRUCTION = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
QUESTION = "\nQuestion: Find all variables that are assigned the value {value} in the text above."
ANSWER_PREFIX = ("Answer: According to the chain(s) of variable assignment in the text above, {count} variables are "
                 "assigned the value {value}, they are: ")
HOPS = 4
ANSWER_TOKENS = 30
EXAMPLE_LINES = 16  # the worked example's noise lines: RULER fits its example to 500 tokens, about this many lines


def _chain(rng: random.Random, letters: int) -> tuple[list[str], list[str]]:
    """(variables, assignment lines) of one chain of HOPS hops with distinct names."""
    names: list[str] = []
    while len(names) < HOPS + 1:
        name = "".join(rng.choices(string.ascii_uppercase, k=letters))
        if name not in names:
            names.append(name)
    lines = [f"VAR {names[0]} = {rng.randint(10000, 99998)}"]
    lines += [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(HOPS)]
    return names, lines


def _scattered(rng: random.Random, lines: list[str], noise: int) -> str:
    """The chain's lines in order at random places among `noise` noise lines."""
    text = [NOISE] * noise
    for offset, at in enumerate(sorted(rng.sample(range(noise), len(lines)))):
        text.insert(at + offset, lines[offset])
    return "\n".join(text).replace(". \n", ".\n")


def generate(rng: random.Random, size: int, essay: str) -> TaskText:
    """An instance with `size` noise lines (the essay is not read: RULER's vt uses noise)."""
    example_names, example_lines = _chain(rng, 3)
    example_value = example_lines[0].split("=")[-1].strip()
    example = (INSTRUCTION + _scattered(rng, example_lines, EXAMPLE_LINES)
               + QUESTION.format(value=example_value) + " "
               + ANSWER_PREFIX.format(count=HOPS + 1, value=example_value) + " ".join(example_names) + "\n")
    names, lines = _chain(rng, 5)
    value = lines[0].split("=")[-1].strip()
    return TaskText(example + INSTRUCTION + _scattered(rng, lines, size), QUESTION.format(value=value),
                    ANSWER_PREFIX.format(count=HOPS + 1, value=value), tuple(names))


TASK = LongTask("vt", "every variable a 4-hop chain of assignments passes a number to", ANSWER_TOKENS, generate,
                smallest=HOPS + 1)
