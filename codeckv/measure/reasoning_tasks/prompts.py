"""The few-shot chain-of-thought prompt of a word problem, in the model's chat template.

    prompt = reasoning_prompt(tokenizer, problem)
    prompt.context_ids    # (1, C) the chat head and the worked examples: the context a press may evict from
    prompt.question_ids   # (1, Q) the problem's turn and the assistant's header, fed after it

As lm-evaluation-harness's gsm8k task with --apply_chat_template --fewshot_as_multiturn: each of SHOTS worked
examples is a user turn "Question: ...\\nAnswer:" and an assistant turn with its worked lines ending "#### N"; the
problem is the last user turn. The examples are drawn from the generator with a seed of their own (SHOT_SEED, which
no --seed can take), so every problem of every seed sees the same examples. The context and the question are
tokenized apart (as the long-context tasks are), so the question is what every tier's cache is fed after the
shared context. A model without a chat template gets the turns as plain text, blank-line separated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from codeckv.measure.reasoning_tasks.word_problems import WordProblem, word_problem

SHOT_SEED = -1
SHOT_STEPS = (2, 3, 4, 5, 3)  # five worked examples (vLLM's GSM8K runs are 5-shot)


@dataclass(frozen=True)
class ReasoningPrompt:
    context_ids: torch.Tensor  # (1, C)
    question_ids: torch.Tensor  # (1, Q)

    @property
    def tokens(self) -> int:
        return self.context_ids.shape[1] + self.question_ids.shape[1]


def _turn(problem: WordProblem) -> str:
    return f"Question: {problem.question}\nAnswer:"


def shot_messages() -> list[dict]:
    messages = []
    for index, steps in enumerate(SHOT_STEPS):
        shot = word_problem(SHOT_SEED, index, steps)
        messages += [{"role": "user", "content": _turn(shot)}, {"role": "assistant", "content": shot.solution}]
    return messages


def reasoning_prompt(tokenizer: PreTrainedTokenizerBase, problem: WordProblem) -> ReasoningPrompt:
    """The problem after the worked examples, split into the shared context and the question (module docstring)."""
    shots = shot_messages()
    asked = {"role": "user", "content": _turn(problem)}
    if tokenizer.chat_template:
        context = tokenizer.apply_chat_template(shots, tokenize=False)
        whole = tokenizer.apply_chat_template([*shots, asked], tokenize=False, add_generation_prompt=True)
        if not whole.startswith(context):
            raise ValueError("this chat template renders the worked examples differently once a question follows; "
                             "the context cannot be split from the question")
        question = whole[len(context):]
    else:
        context = "\n\n".join(m["content"] for m in shots) + "\n\n"
        question = _turn(problem)
    encode = lambda text: tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids  # noqa: E731
    return ReasoningPrompt(encode(context), encode(question))
