"""What a loaded model is: the transformers model, its tokenizer, and the facts about it the rest of codeckv reads.

codeckv.models loads one (load_model); the cache, the measurements and the app only read these fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import PreTrainedModel, PreTrainedTokenizerBase


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
    kv_bytes_per_token_bf16: int = field(init=False)  # design.md: 2 x full-attention layers x kv_heads x head_dim x 2
    native_only_layers: int = field(init=False)  # sliding-window / linear layers, counted separately

    def __post_init__(self) -> None:
        full = sum(t == "full_attention" for t in self.layer_types)
        self.kv_bytes_per_token_bf16 = 2 * full * self.num_kv_heads * self.head_dim * 2
        self.native_only_layers = len(self.layer_types) - full

    @property
    def codec_layers(self) -> int:
        return len(self.layer_types) - self.native_only_layers


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    info: ModelInfo
