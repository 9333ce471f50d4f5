"""Reading the final number out of a reply, as lm-evaluation-harness's gsm8k task does (gsm8k.yaml, version 3).

    strict_answer("... 15 + 12 = 27 marbles.\n#### 27")   # "27": the number after "#### ", the first one
    flexible_answer("... so she has 27 marbles.")         # "27": the last number-like run of the reply
    is_correct("27.", 27)                                 # True: exact match after lm-eval's normalization

Two filters, reported side by side as lm-eval reports them: "strict-match", the regex `#### (\\-?[0-9\\.\\,]+)`,
first match; and "flexible-extract", the regex `(-?[$0-9.,]{2,})|(-?[0-9]+)`, last match (group_select -1), the
non-empty group of it. No match gives lm-eval's fallback "[invalid]". The metric is exact_match after removing
",", "$", anything up to "#### " and a final "." from both sides, case-insensitively. A reply is cut at the
generation's stop strings first (`until`: "Question:" and the end-of-turn tokens, which never reach the text).
"""

from __future__ import annotations

import re

INVALID = "[invalid]"  # lm-eval's regex filter fallback
STOP_STRINGS = ("Question:",)  # gsm8k.yaml's `until`, besides </s> and <|im_end|> (stop tokens here)
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_IGNORED = (re.compile(","), re.compile(r"\$"), re.compile(r"(?s).*#### "), re.compile(r"\.$"))


def cut_at_stop(text: str) -> str:
    """The reply up to its first stop string (the generation would have ended there)."""
    for stop in STOP_STRINGS:
        text = text.split(stop, 1)[0]
    return text


def has_stop(text: str) -> bool:
    return any(stop in text for stop in STOP_STRINGS)


def strict_answer(reply: str) -> str:
    found = _STRICT.findall(reply)
    return found[0].strip() if found else INVALID


def flexible_answer(reply: str) -> str:
    found = _FLEXIBLE.findall(reply)
    if not found:
        return INVALID
    groups = [group for group in found[-1] if group]
    return groups[0].strip() if groups else INVALID


def normalized(answer: str) -> str:
    """lm-eval's exact_match normalization (regexes_to_ignore, ignore_case)."""
    for pattern in _IGNORED:
        answer = pattern.sub("", answer)
    return answer.strip().lower()


def is_correct(extracted: str, answer: int) -> bool:
    return extracted != INVALID and normalized(extracted) == normalized(str(answer))
