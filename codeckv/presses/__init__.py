"""Token eviction: one press per file; a press decides which tokens a layer keeps (presses/base.py).

PRESSES names each press class, as the tiers' names do (codeckv/tiers.py: "snapkv-50" is SnapKVPress(ratio=0.5),
"snapkv-875" SnapKVPress(ratio=0.875)).
"""

from codeckv.presses.base import (
    PRESS_MODE_MEANING,
    PRESS_MODES,
    RATIOS,
    Press,
    Rope,
    check_press_mode,
    keep_indices,
    kept_count,
)
from codeckv.presses.budget import Budget
from codeckv.presses.decoding import Decoding
from codeckv.presses.expected_attention import ExpectedAttentionPress
from codeckv.presses.knorm import KnormPress
from codeckv.presses.snapkv import SnapKVPress
from codeckv.presses.streamingllm import StreamingLLMPress
from codeckv.presses.tova import TOVAPress

PRESSES: dict[str, type[Press]] = {
    "streamingllm": StreamingLLMPress,
    "snapkv": SnapKVPress,
    "knorm": KnormPress,
    "tova": TOVAPress,
    "expected": ExpectedAttentionPress,
}

__all__ = ["PRESSES", "PRESS_MODES", "PRESS_MODE_MEANING", "RATIOS", "Budget", "Decoding", "ExpectedAttentionPress",
           "KnormPress", "Press", "Rope", "SnapKVPress", "StreamingLLMPress", "TOVAPress", "check_press_mode",
           "keep_indices", "kept_count"]
