"""Long-context tasks in the style of RULER (Hsieh et al., 2024; NVIDIA/RULER), generated here: no download.

    sample = long_sample("niah_single_2", tokenizer, length=4096, seed=0, index=3)
    sample.context_ids, sample.question_ids   # framed in the model's chat template, fitting 4,096 tokens
    string_match_all(answer, sample.outputs)  # RULER's score of an answer, 0-100

TASK_NAMES lists the 11 synthetic tasks of RULER's 13 (synthetic.yaml): niah_single_1/2/3, niah_multikey_1/2/3,
niah_multivalue, niah_multiquery (niah.py), vt (variable_tracking.py), cwe (common_words.py), fwe
(frequent_words.py). RULER's two QA tasks (qa_1, qa_2) read SQuAD and HotpotQA, downloads, and are left out.
The runner that measures tiers on them is codeckv/measure/ruler.py.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from codeckv.measure.long_tasks import common_words, frequent_words, niah, variable_tracking
from codeckv.measure.long_tasks.base import LongTask, Sample, build_sample, check_fits, string_match_all
from codeckv.measure.long_tasks.haystack import DEFAULT_HAYSTACK, haystack_text

TASK_NAMES = (*niah.TASKS, "vt", "cwe", "fwe")


def long_task(name: str, length: int) -> LongTask:
    """The task `name` as generated at `length` tokens (cwe and fwe scale with it); a ValueError lists the names."""
    if name in niah.TASKS:
        return niah.TASKS[name]
    if name == "vt":
        return variable_tracking.TASK
    if name == "cwe":
        return common_words.task_for(length)
    if name == "fwe":
        return frequent_words.task_for(length)
    raise ValueError(f"unknown task {name!r} (allowed: {', '.join(TASK_NAMES)})")


def long_sample(name: str, tokenizer: PreTrainedTokenizerBase, length: int, seed: int = 0, index: int = 0,
                haystack: str = DEFAULT_HAYSTACK) -> Sample:
    """Sample `index` of task `name` for `seed`, as large as fits `length` tokens; the essay haystack is an embedded
    text by name or a UTF-8 file (haystack.py)."""
    return build_sample(long_task(name, length), tokenizer, length, seed, index, haystack_text(haystack))


def check_sample_fits(name: str, tokenizer: PreTrainedTokenizerBase, length: int, seed: int = 0,
                      haystack: str = DEFAULT_HAYSTACK) -> None:
    """long_sample's ValueError for a length too short for task `name`, from the tokenizer alone (sample 0's smallest
    instance; another sample's draws can need a few tokens more, and long_sample refuses that one when it is built)."""
    check_fits(long_task(name, length), tokenizer, length, seed, 0, haystack_text(haystack))


__all__ = ["TASK_NAMES", "LongTask", "Sample", "check_sample_fits", "long_sample", "long_task", "string_match_all"]
