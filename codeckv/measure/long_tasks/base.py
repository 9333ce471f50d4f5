"""What every long-context task shares: a task's text, its framing in the chat template, fitting it to a length.

A task (one per file in this package) turns a random generator and a haystack size into a TaskText: the context
(everything a press may evict from), the question after it, the answer prefix the assistant's turn starts with,
and the strings a correct answer contains. `build_sample` frames that text in the model's chat template

    [chat head] context  question [end of the user's turn, the assistant's header] answer prefix

and grows the haystack, by bisection as RULER does, to the most that fits `length` tokens together with the
task's answer budget: context ids + question ids + answer tokens <= length, counted by the model's own
tokenizer. The context and the question are tokenized apart (as kvpress's RULER pipeline does), so the context is
exactly what a press sees and the question is fed after it, unpressed.

Scoring is RULER's string_match_all: the share of the expected strings found in the answer, case-insensitively,
as a percentage.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

CHAT_MARKER = "\u241fcodeckv-task\u241f"  # stands for the user's message while the chat template is rendered


@dataclass(frozen=True)
class TaskText:
    """One generated instance of a task, as text."""

    context: str  # the instruction and the haystack: what a press compresses
    question: str  # asked after the context (and after the haystack: RULER's templates end with it)
    answer_prefix: str  # how the assistant's reply begins; the model continues it
    outputs: tuple[str, ...]  # the strings a correct answer contains


@dataclass(frozen=True)
class LongTask:
    """A RULER task: its name, what it tests, its answer budget and how to generate an instance of a given size."""

    name: str
    tests: str  # one line: what the task asks of the model
    answer_tokens: int  # RULER's tokens_to_generate for the task
    generate: Callable[[random.Random, int, str], TaskText]  # (rng, haystack size, essay text) -> TaskText
    smallest: int = 1  # the least haystack size that makes a valid instance


@dataclass(frozen=True)
class Sample:
    """A task instance framed for one model: ids ready for a prefill, the question, and what to look for."""

    task: str
    length: int  # the tokens asked for (context + question + answer budget fit within it)
    index: int  # which sample of the seed
    context_ids: torch.Tensor  # (1, C)
    question_ids: torch.Tensor  # (1, Q): the question, the end of the user's turn and the answer prefix
    outputs: tuple[str, ...]
    answer_tokens: int
    size: int  # the haystack size that fits

    @property
    def prompt_tokens(self) -> int:
        return self.context_ids.shape[1] + self.question_ids.shape[1]


def string_match_all(answer: str, outputs: tuple[str, ...]) -> float:
    """RULER's score of one answer: 100 x the share of `outputs` found in it, case-insensitively."""
    if not outputs:
        raise ValueError("a sample needs at least one expected string")
    found = sum(1 for expected in outputs if expected.lower() in answer.lower())
    return 100.0 * found / len(outputs)


def chat_frame(tokenizer: PreTrainedTokenizerBase) -> tuple[str, str, bool]:
    """(head, tail, add_special_tokens): the text the chat template writes before and after the user's message
    (the tail ends with the assistant's header); a model without a template gets the bare text and its BOS."""
    if not tokenizer.chat_template:
        return "", "\n", True
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": CHAT_MARKER}], add_generation_prompt=True,
                                             tokenize=False)
    head, tail = rendered.split(CHAT_MARKER)
    return head, tail, False


def frame(tokenizer: PreTrainedTokenizerBase, text: TaskText) -> tuple[torch.Tensor, torch.Tensor]:
    """(1, C) context ids and (1, Q) question ids of `text` in the model's chat template."""
    head, tail, special = chat_frame(tokenizer)
    context = tokenizer(head + text.context, add_special_tokens=special, return_tensors="pt").input_ids
    question = tokenizer(text.question + tail + text.answer_prefix, add_special_tokens=False,
                         return_tensors="pt").input_ids
    return context, question


def sample_rng(task: str, length: int, seed: int, index: int) -> random.Random:
    """The generator of one sample: the same draws whatever else a run asks for (other tasks, lengths, tiers)."""
    return random.Random(f"{task}:{length}:{seed}:{index}")


def build_sample(task: LongTask, tokenizer: PreTrainedTokenizerBase, length: int, seed: int, index: int,
                 haystack: str) -> Sample:
    """The largest instance of `task` whose framed prompt and answer budget fit `length` tokens (module docstring);
    a ValueError when even the smallest does not."""

    def made(size: int) -> tuple[TaskText, torch.Tensor, torch.Tensor]:
        text = task.generate(sample_rng(task.name, length, seed, index), size, haystack)
        return (text, *frame(tokenizer, text))

    def fits(size: int) -> bool:
        _, context, question = made(size)
        return context.shape[1] + question.shape[1] + task.answer_tokens <= length

    check_fits(task, tokenizer, length, seed, index, haystack)
    low, high = task.smallest, task.smallest * 2
    while fits(high):  # doubling, then bisection: O(log size) tokenizations of the whole prompt
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    text, context, question = made(low)  # low only ever takes sizes that fit
    return Sample(task.name, length, index, context, question, text.outputs, task.answer_tokens, low)


def check_fits(task: LongTask, tokenizer: PreTrainedTokenizerBase, length: int, seed: int, index: int,
               haystack: str) -> None:
    """A ValueError when even the smallest instance of `task` (its instruction, question and answer budget) does not
    fit `length` tokens: one tokenization, so a grid can ask with the tokenizer alone, before its model loads."""
    text = task.generate(sample_rng(task.name, length, seed, index), task.smallest, haystack)
    context, question = frame(tokenizer, text)
    need = context.shape[1] + question.shape[1] + task.answer_tokens
    if need > length:
        raise ValueError(f"{task.name} needs at least {need} tokens with this tokenizer (its instruction, question "
                         f"and {task.answer_tokens} answer tokens); {length} asked for")
