"""Remove and re-apply rotary position embeddings (RoPE) on cached keys, exactly.

transformers applies RoPE inside the attention module, before `cache.update`, so the cache sees
post-RoPE keys. RoPE rotates channel pairs (i, i + R/2) of the first R channels by angles that depend on
the position: an orthogonal map, so a codec can undo it, code the position-free ("pre-RoPE") keys, and redo it:

    rope = Rope.from_config(model.config)        # the full-attention layers' RoPE
    pre = rope.remove(keys, start)               # keys (..., S, D) at positions start .. start + S - 1
    post = rope.apply(pre, start)                # == keys up to float rounding

A Rope is its frequencies `inv_freq` (R/2,): the default RoPE's from theta over R = head_dim x
partial_rotary_factor channels, a scaled RoPE's (llama3, yarn, linear, ...) from transformers' own
functions, none (R = 0, the identity) for a model without RoPE or whose cached keys carry none (MLA's latent).
Removing any such rotation and applying it back gives the keys again, so a coder is right whatever it
removes; removing the model's own leaves position-free keys, which a calibrated basis codes best.
"""

from __future__ import annotations

import functools

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the last axis, as transformers' Llama and Gemma do."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@functools.lru_cache(maxsize=4)
def _cos_sin(inv_freq: bytes, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rope.cos_sin on the CPU, kept for the next layer: a cache's layers share one RoPE, and a conversion or a
    flush removes and re-applies it at the same positions in every layer."""
    freqs = torch.arange(start, start + count, dtype=torch.float64)[:, None] * torch.frombuffer(
        bytearray(inv_freq), dtype=torch.float64)[None, :]  # (S, R/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().float(), emb.sin().float()


class Rope:
    """cos/sin of one RoPE at any positions: `inv_freq` (R/2,) float64 rotates the first R of head_dim channels."""

    def __init__(self, head_dim: int, inv_freq: torch.Tensor) -> None:
        if 2 * inv_freq.numel() > head_dim:
            raise ValueError(f"Rope: {2 * inv_freq.numel()} rotary channels exceed head_dim={head_dim}")
        self.head_dim, self.inv_freq = head_dim, inv_freq.double()  # (R/2,)

    @classmethod
    def default(cls, head_dim: int, theta: float, rotary_dim: int | None = None) -> Rope:
        """The default RoPE of base `theta` over the first rotary_dim (default: all) channels."""
        rotary = head_dim if rotary_dim is None else rotary_dim
        return cls(head_dim, 1.0 / theta ** (torch.arange(0, rotary, 2, dtype=torch.float64) / rotary))

    @classmethod
    def none(cls, head_dim: int) -> Rope:
        """No rotation: remove and apply give the keys back as they are."""
        return cls(head_dim, torch.zeros(0, dtype=torch.float64))

    @classmethod
    def from_config(cls, config) -> Rope:
        """The RoPE of a transformers config's full-attention layers (module docstring; hybrid configs nest it)."""
        config = config.get_text_config(decoder=True)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        params = getattr(config, "rope_parameters", None)
        if not params or getattr(config, "kv_lora_rank", None):  # no RoPE, or MLA: the cached latent carries none
            return cls.none(head_dim)
        params = params.get("full_attention", params)
        factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0
        kind = params.get("rope_type", "default")
        if kind == "default":
            return cls.default(head_dim, float(params.get("rope_theta", 10000.0)), int(head_dim * factor))
        if kind not in ROPE_INIT_FUNCTIONS:
            return cls.none(head_dim)  # a RoPE transformers computes otherwise: coded with it in the keys
        layer_type = "full_attention" if "full_attention" in (getattr(config, "rope_parameters", None) or {}) else None
        inv_freq, _ = ROPE_INIT_FUNCTIONS[kind](config, "cpu", layer_type=layer_type)
        return cls(head_dim, inv_freq.double())

    @property
    def rotary_dim(self) -> int:
        """R: the channels it rotates."""
        return 2 * self.inv_freq.numel()

    def cos_sin(self, start: int, count: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (count, R) float32 of positions start .. start + count - 1 (shared: read them, never write)."""
        cos, sin = _cos_sin(self.inv_freq.numpy().tobytes(), start, count)
        return cos.to(device), sin.to(device)

    def _rotate(self, x: torch.Tensor, start: int, sign: float) -> torch.Tensor:
        rotary = self.rotary_dim
        if rotary == 0:
            return x
        cos, sin = self.cos_sin(start, x.shape[-2], x.device)
        turned = x[..., :rotary] * cos + sign * rotate_half(x[..., :rotary]) * sin
        return turned if rotary == x.shape[-1] else torch.cat([turned, x[..., rotary:]], dim=-1)

    def apply(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """Rotate float x (..., S, D) as positions start.. (pre-RoPE -> post-RoPE)."""
        return self._rotate(x, start, 1.0)

    def remove(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """Inverse of apply: post-RoPE float x (..., S, D) at positions start.. -> pre-RoPE."""
        return self._rotate(x, start, -1.0)

    def state(self) -> dict:
        """What saving this Rope keeps (Rope.from_state reads it back)."""
        return {"head_dim": self.head_dim, "inv_freq": self.inv_freq}

    @classmethod
    def from_state(cls, state: dict) -> Rope:
        return cls(state["head_dim"], state["inv_freq"])
