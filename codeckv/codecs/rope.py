"""Remove and re-apply rotary position embeddings (RoPE) on cached keys, exactly.

transformers applies RoPE inside the attention module, before `cache.update`, so the cache sees
post-RoPE keys. RoPE rotates channel pairs (i, i + D/2) by angles that depend on the position: an
orthogonal map, so a codec can undo it, code the position-free ("pre-RoPE") keys, and redo it:

    rope = Rope.from_config(model.config)        # the full-attention layers' default RoPE
    pre = rope.remove(keys, start)               # keys (..., S, D) at positions start .. start + S - 1
    post = rope.apply(pre, start)                # == keys up to float rounding
"""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the last axis, as transformers' Llama and Gemma do."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Rope:
    """cos/sin of one default RoPE (theta, head_dim) at any positions."""

    def __init__(self, head_dim: int, theta: float) -> None:
        self.head_dim, self.theta = head_dim, theta
        self.inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (D/2,)

    @classmethod
    def from_config(cls, config) -> Rope:
        """The RoPE of a transformers config's full-attention layers (hybrid configs nest it by layer type)."""
        config = config.get_text_config(decoder=True)
        params = getattr(config, "rope_parameters", None) or {}
        params = params.get("full_attention", params)
        kind = params.get("rope_type", "default")
        if kind != "default":
            raise ValueError(f"RoPE type {kind!r} is not supported by the PCA tiers (allowed: 'default')")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(head_dim, float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0))))

    def cos_sin(self, start: int, count: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (count, D) float32 of positions start .. start + count - 1."""
        freqs = torch.arange(start, start + count, dtype=torch.float64)[:, None] * self.inv_freq[None, :]  # (S, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().float().to(device), emb.sin().float().to(device)

    def apply(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """Rotate float x (..., S, D) as positions start.. (pre-RoPE -> post-RoPE)."""
        cos, sin = self.cos_sin(start, x.shape[-2], x.device)
        return x * cos + rotate_half(x) * sin

    def remove(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """Inverse of apply: post-RoPE float x (..., S, D) at positions start.. -> pre-RoPE."""
        cos, sin = self.cos_sin(start, x.shape[-2], x.device)
        return x * cos - rotate_half(x) * sin
