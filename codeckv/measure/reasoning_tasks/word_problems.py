"""Grade-school word problems generated from templates, in the style of GSM-Symbolic (Mirzadeh et al., 2024).

    problem = word_problem(seed=0, index=7, steps=4)
    problem.question     # "Maya has 23 stickers. She buys 3 packs with 6 stickers in each pack. ..."
    problem.solution     # the worked lines, one operation each, ending "#### 37"
    problem.answer       # 37

A problem is a person and a pile of objects, then events that change the pile, each a sentence from a template:
buying more, giving some away, buying packs (two operations: packs x size, then the sum), the pile doubling
or tripling, a pile split into equal parts of which one is kept. The name, the objects, the events and every
number are drawn from a generator seeded by (seed, index, steps), so no model has seen the problems and none is
downloaded; the answer is computed as the events are drawn, and every intermediate value stays a whole number in
1..MAX_VALUE (a split only by a divisor). `steps` counts arithmetic operations, as GSM8K's difficulty does: the
worked solution has one line per operation, the form the few-shot examples teach (reasoning_tasks/prompts.py).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

MIN_STEPS, MAX_STEPS = 2, 8
MAX_VALUE = 999

NAMES = (("Maya", "she", "her"), ("Liam", "he", "his"), ("Priya", "she", "her"), ("Tomás", "he", "his"),
         ("Aisha", "she", "her"), ("Kenji", "he", "his"), ("Sofia", "she", "her"), ("Omar", "he", "his"),
         ("Elena", "she", "her"), ("Noah", "he", "his"), ("Zara", "she", "her"), ("Mateo", "he", "his"))
FRIENDS = ("Ben", "Clara", "Dev", "Fatima", "Grace", "Hugo", "Ines", "Jonas", "Lena", "Ravi")
OBJECTS = ("stickers", "marbles", "apples", "pencils", "stamps", "shells", "cookies", "books", "coins", "cards")
CONTAINERS = ("packs", "boxes", "bags", "jars")


@dataclass(frozen=True)
class WordProblem:
    question: str
    solution: str  # one line per operation, then "#### <answer>"
    answer: int
    steps: int


@dataclass
class _Story:
    """The problem as it is drawn: the sentences, the worked lines and the running count."""

    rng: random.Random
    name: str
    pronoun: str
    possessive: str
    objects: str
    value: int
    sentences: list[str]
    lines: list[str]

    def buy(self) -> bool:
        n = self.rng.randint(2, 20)
        if self.value + n > MAX_VALUE:
            return False
        self.sentences.append(f"{self.pronoun.capitalize()} buys {n} more {self.objects}.")
        self._line(f"After buying {n} more, {self.pronoun} has {self.value} + {n} = {self.value + n} {self.objects}.",
                   self.value + n)
        return True

    def give(self) -> bool:
        if self.value < 4:
            return False
        n = self.rng.randint(2, min(self.value - 1, 20))
        friend = self.rng.choice(FRIENDS)
        self.sentences.append(f"{self.pronoun.capitalize()} gives {n} {self.objects} to {friend}.")
        self._line(f"After giving {n} to {friend}, {self.pronoun} has {self.value} - {n} = {self.value - n} "
                   f"{self.objects}.", self.value - n)
        return True

    def packs(self) -> bool:  # two operations
        count, size = self.rng.randint(2, 5), self.rng.randint(2, 10)
        if self.value + count * size > MAX_VALUE:
            return False
        container = self.rng.choice(CONTAINERS)
        self.sentences.append(f"{self.pronoun.capitalize()} buys {count} {container} with {size} {self.objects} in "
                              f"each of them.")
        self.lines.append(f"The {container} hold {count} x {size} = {count * size} {self.objects}.")
        self._line(f"Now {self.pronoun} has {self.value} + {count * size} = {self.value + count * size} "
                   f"{self.objects}.", self.value + count * size)
        return True

    def grow(self) -> bool:
        k = self.rng.randint(2, 3)
        if self.value * k > MAX_VALUE:
            return False
        verb = {2: "doubles", 3: "triples"}[k]
        self.sentences.append(f"Then the number of {self.objects} {self.pronoun} has {verb}.")
        self._line(f"After it {verb}, {self.pronoun} has {self.value} x {k} = {self.value * k} {self.objects}.",
                   self.value * k)
        return True

    def split(self) -> bool:
        parts = [k for k in (2, 3, 4, 5) if self.value % k == 0 and self.value // k >= 2]
        if not parts:
            return False
        k = self.rng.choice(parts)
        self.sentences.append(f"{self.pronoun.capitalize()} splits {self.possessive} {self.objects} into {k} equal "
                              f"piles and keeps only one pile.")
        self._line(f"One of {k} equal piles is {self.value} / {k} = {self.value // k} {self.objects}.",
                   self.value // k)
        return True

    def _line(self, text: str, value: int) -> None:
        self.lines.append(text)
        self.value = value


ONE_STEP = ("buy", "give", "grow", "split")  # events of one operation; "packs" is two


def word_problem(seed: int, index: int, steps: int) -> WordProblem:
    """Problem `index` of `seed` with `steps` arithmetic operations (module docstring); the same on every machine."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not MIN_STEPS <= steps <= MAX_STEPS:
        raise ValueError(f"steps={steps!r} must be a whole number in {MIN_STEPS}..{MAX_STEPS}")
    rng = random.Random(f"codeckv-word-problem/{seed}/{index}/{steps}")  # a str seed: stable across Pythons
    name, pronoun, possessive = rng.choice(NAMES)
    objects = rng.choice(OBJECTS)
    story = _Story(rng, name, pronoun, possessive, objects, rng.randint(5, 30), [], [])
    opening = f"{name} has {story.value} {objects}."
    story.lines.append(f"{name} starts with {story.value} {objects}.")
    done = 0
    while done < steps:
        kinds = list(ONE_STEP) + (["packs"] if steps - done >= 2 else [])
        kind = rng.choice(kinds)
        if getattr(story, kind)():
            done += 2 if kind == "packs" else 1
    question = " ".join([opening, *story.sentences, f"How many {objects} does {name} have now?"])
    solution = "\n".join([*story.lines, f"#### {story.value}"])
    return WordProblem(question, solution, story.value, steps)
