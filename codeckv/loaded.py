"""What a loaded model is: the transformers model, its tokenizer, and the facts about it the rest of codeckv reads.

codeckv.models loads one (load_model); the cache, the measurements and the app only read these fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import PreTrainedModel, PreTrainedTokenizerBase

WINDOWED = ("sliding_attention", "chunked_attention", "hybrid_sliding")  # transformers' layer types keeping a window
KV_KINDS = ("full_attention", "hybrid", *WINDOWED)  # the layer types holding keys and values ("hybrid": beside a state)


@dataclass
class ModelInfo:
    """What the app and the measurements need to know about a loaded model."""

    name: str
    source: str  # "converted copy", "gguf", "hub"
    layer_types: list[str]
    num_kv_heads: int
    head_dim: int
    dtype: str
    device: str
    max_context: int
    load_seconds: float
    kv_bytes_per_token_bf16: int = field(init=False)  # design.md: 2 x codec-carrying layers x kv_heads x head_dim x 2
    native_only_layers: int = field(init=False)  # layers no tier codes (linear attention), counted separately

    def __post_init__(self) -> None:
        self.kv_bytes_per_token_bf16 = 2 * self.codec_layers * self.num_kv_heads * self.head_dim * 2
        self.native_only_layers = len(self.layer_types) - self.codec_layers

    @property
    def codec_layers(self) -> int:
        """Layers that keep keys and values, which a per-tensor tier codes: full attention, sliding windows (whose
        bytes per token hold while the context fits the window), hybrids' attention (cache/schedule.py)."""
        return sum(t in KV_KINDS for t in self.layer_types)

    @property
    def sliding_layers(self) -> int:
        """Of those, the layers whose cache keeps a window of tokens."""
        return sum(t in WINDOWED for t in self.layer_types)


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    info: ModelInfo
