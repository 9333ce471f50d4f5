"""The RULER-style tasks: each sample fits the length asked for, holds what its answer needs, and repeats per seed."""

import collections
import re

import pytest

from codeckv.measure.long_tasks import TASK_NAMES, long_sample, long_task, string_match_all
from codeckv.measure.long_tasks.frequent_words import zeta
from codeckv.measure.long_tasks.haystack import haystack_text


def text_of(loaded, sample) -> str:
    return loaded.tokenizer.decode(sample.context_ids[0])


@pytest.mark.parametrize("length", [1024, 2048])
@pytest.mark.parametrize("task", TASK_NAMES)
def test_a_sample_fills_its_length_and_holds_its_answer(loaded, task, length):
    sample = long_sample(task, loaded.tokenizer, length, seed=0, index=0)
    total = sample.prompt_tokens + sample.answer_tokens
    assert total <= length, f"{task}: {total} tokens for {length}"
    assert total >= 0.9 * length, f"{task}: {total} tokens of {length}: the haystack did not grow to the length"
    context = text_of(loaded, sample)
    if task == "fwe":  # the expected words are the 2nd-4th most frequent, after the noise "..."
        counts = collections.Counter(context.split("frequently appeared coded words. ")[1].split())
        ranked = [word for word, _ in counts.most_common(4)]
        assert ranked[0] == "..." and set(ranked[1:]) == set(sample.outputs)
    elif task == "cwe":  # the common words are the 10 most frequent of the last list (after the worked example)
        listed = re.findall(r"\d+\. (\S+)", context.rsplit("Memorize the ones that appear most often.", 1)[1])
        assert {word for word, _ in collections.Counter(listed).most_common(10)} == set(sample.outputs)
    else:  # needles and variables: every expected string sits in the context
        assert all(expected in context for expected in sample.outputs)
    question = loaded.tokenizer.decode(sample.question_ids[0])
    assert "?" in question or "Question" in question


def test_samples_repeat_for_a_seed_and_differ_across_indices(loaded):
    first = long_sample("niah_single_2", loaded.tokenizer, 1024, seed=3, index=0)
    again = long_sample("niah_single_2", loaded.tokenizer, 1024, seed=3, index=0)
    other = long_sample("niah_single_2", loaded.tokenizer, 1024, seed=3, index=1)
    assert first.context_ids.equal(again.context_ids) and first.outputs == again.outputs
    assert first.outputs != other.outputs


def test_multikey_hides_distractors_and_multiquery_asks_four(loaded):
    multikey = text_of(loaded, long_sample("niah_multikey_1", loaded.tokenizer, 1024))
    assert multikey.count("One of the special magic numbers for") == 4  # the needle and 3 distractors
    multiquery = long_sample("niah_multiquery", loaded.tokenizer, 1024)
    assert len(multiquery.outputs) == 4
    assert loaded.tokenizer.decode(multiquery.question_ids[0]).count(", and ") == 2  # the question, the prefix


def test_the_scores_are_rulers_share_of_expected_strings_found():
    assert string_match_all("The numbers are 123 and 456.", ("123", "456", "789")) == pytest.approx(200 / 3)
    assert string_match_all("uuid ABC-def", ("abc-DEF",)) == 100.0
    assert string_match_all("", ("1",)) == 0.0


def test_a_length_too_short_for_the_task_is_refused_with_what_it_needs(loaded):
    with pytest.raises(ValueError, match=r"niah_single_1 needs at least \d+ tokens"):
        long_sample("niah_single_1", loaded.tokenizer, 100)
    with pytest.raises(ValueError, match="unknown task 'qa_1'"):
        long_task("qa_1", 4096)


def test_a_users_haystack_file_is_the_essay(loaded, tmp_path):
    words = " ".join(f"Zebra number {i} grazes quietly." for i in range(400))
    path = tmp_path / "haystack.txt"
    path.write_text(words, encoding="utf-8")
    sample = long_sample("niah_single_2", loaded.tokenizer, 1024, haystack=str(path))
    context = text_of(loaded, sample)
    assert "Zebra number" in context and sample.outputs[0] in context


@pytest.mark.parametrize(("content", "message"), [
    (b"\xff\xfe not text", "not UTF-8"),
    (b"too few words", "at least 200"),
])
def test_a_bad_haystack_file_is_refused(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        haystack_text(str(path))
    with pytest.raises(ValueError, match="neither an embedded text"):
        haystack_text(str(tmp_path / "missing.txt"))


def test_zeta_matches_its_closed_form():
    assert zeta(2.0) == pytest.approx(3.141592653589793**2 / 6, rel=1e-12)
    assert zeta(4.0) == pytest.approx(3.141592653589793**4 / 90, rel=1e-12)
