"""The largest chat turn the app allows, run alone: prints its prompt tokens and peak RSS growth (MiB) as JSON.

Run in a fresh process by test_chat.py (peak RSS is per process): python tests/measure/max_request.py TIER NEW
(NEW new tokens: memory is set by the prompt, each new token adds one token to four caches).
"""

import json
import resource
import sys
from collections import deque

from codeckv.corpus import corpus_text
from codeckv.measure.chat import ChatSession
from codeckv.models import load_model
from codeckv.serve.limits import Limits, release_memory
from codeckv.tiers import get_tier


def main(tier: str, new_tokens: int) -> None:
    limits = Limits.from_env()
    loaded = load_model()
    release_memory()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    question = "\n\nSummarize this."
    room = limits.max_prompt_tokens - new_tokens - 64  # the new tokens, and the chat template around the message
    ids = loaded.tokenizer(corpus_text()).input_ids[:room]
    turn = ChatSession().ask(loaded, loaded.tokenizer.decode(ids) + question, get_tier(tier), new_tokens,
                             max_prompt_tokens=limits.max_prompt_tokens)
    update = deque(turn, maxlen=1)[0]  # the last update holds the results
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"prompt_tokens": update.result.native.prompt_tokens,
                      "new_tokens": len(update.result.native.token_ids), "peak_growth_mib": peak - before}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
