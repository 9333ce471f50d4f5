"""Joint PCA transform coding of one layer's keys and values (KVTC-style), with entropy-coded codes.

Per token, the keys and values of every KV head of a layer form one vector x of d = H * (D + Dv)
numbers, keys de-rotated first (RoPE removed, codeckv/rope.py: position-free keys share one basis).
Calibration (codeckv/calibration.py) gives each layer constants, stored with the model, not per token:

    mean   (d,)     calibration mean
    enc    (d, r)   analysis: y = (x - mean) @ enc           Fisher-whitened PCA basis, r components kept
    dec    (r, d)   synthesis: x^ = y^ @ dec + mean          (enc's pseudo-inverse)
    step            one ECSQ step for every component (reverse water-filling in the whitened domain)
    table           EntropyTable of the codes (codecs/ans.py)

    q = sign(y) * floor(|y| / step + 1/2)       the integer codes (entropy-constrained scalar quantization)
    y^ = q * step                               components that never leave 0 on calibration are dropped

The basis is whitened by the Fisher information of the loss (E[g g^T] of the gradients w.r.t. K and V),
so equal squared error in every component means equal expected loss: one step for all components
is the optimal bit allocation, and the entropy coder turns near-zero components into near-zero bits.

An archived chunk (`unit` tokens) stores one ANS stream of its codes. Tokens at positions below
`sink_tokens` (the attention sink: an outlier the calibrated basis does not fit) are coded apart
with 8-bit min/max groups (codecs/quant.py), in the chunk that holds them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codeckv.codecs.ans import ESCAPE_RANGE, LENGTH_BYTES, EntropyTable
from codeckv.codecs.base import Encoded
from codeckv.codecs.quant import GroupQuant
from codeckv.rope import Rope

SINK_CODEC = GroupQuant(bits=8, group=32)


@dataclass(frozen=True)
class JointPCA:
    """What a PCA tier asks of calibration: the bit budget and how much calibration text."""

    bits_per_element: float  # mean entropy of the codes per K/V element, on the calibration text
    sink_tokens: int = 1  # positions < sink_tokens are coded apart (8-bit groups)
    calibration_windows: int = 8  # calibration text: windows x tokens (codeckv/calibration.py)
    calibration_length: int = 512

    def __post_init__(self) -> None:
        if not 0 < self.bits_per_element <= 16:
            raise ValueError(f"JointPCA: bits_per_element={self.bits_per_element!r} (allowed: 0 < bits <= 16)")
        for name in ("sink_tokens", "calibration_windows", "calibration_length"):
            value = getattr(self, name)
            least = 0 if name == "sink_tokens" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"JointPCA: {name}={value!r} must be an integer >= {least}")


def ecsq(y: torch.Tensor, step: float) -> torch.Tensor:
    """Uniform scalar quantization to the nearest multiple of step: (..., r) float -> int32 codes."""
    return torch.round(y / step).to(torch.int32)


@dataclass
class Chunk:
    """What the archive holds for one chunk: the ANS stream of its codes, and its sink tokens coded apart."""

    stream: bytes
    sink: tuple[Encoded, Encoded] | None = None  # keys, values of the chunk's leading sink tokens

    @property
    def nbytes(self) -> int:
        sink = sum(e.nbytes for e in self.sink) if self.sink else 0
        return len(self.stream) + LENGTH_BYTES + sink


@dataclass
class LayerCoder:
    """One layer's calibrated transform coder (module docstring): K and V (B, H, S, D) <-> chunks."""

    mean: torch.Tensor  # (d,)
    enc: torch.Tensor  # (d, r)
    dec: torch.Tensor  # (r, d)
    step: float
    table: EntropyTable
    heads: int
    head_dim: int  # keys; values have (d - heads * head_dim) / heads channels
    rope: Rope
    sink_tokens: int = 1
    component_bits: torch.Tensor | None = None  # (r,) mean bits per token of each component on calibration

    @property
    def kept(self) -> int:
        return self.enc.shape[1]

    def rows(self, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
        """Keys (RoPE removed) and values (B, H, S, D) at positions start.. -> (B, S, d) float32 vectors."""
        b, h, s, _ = keys.shape
        k = self.rope.remove(keys.float(), start).transpose(1, 2).reshape(b, s, -1)
        v = values.float().transpose(1, 2).reshape(b, s, -1)
        return torch.cat([k, v], dim=-1)

    def unrows(self, x: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inverse of rows: (B, S, d) vectors -> keys (RoPE re-applied), values (B, H, S, D) float32."""
        b, s, d = x.shape
        split = self.heads * self.head_dim
        k = x[..., :split].reshape(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = x[..., split:].reshape(b, s, self.heads, (d - split) // self.heads).transpose(1, 2)
        return self.rope.apply(k, start), v

    def encode(self, keys: torch.Tensor, values: torch.Tensor, start: int, unit: int) -> list[Chunk]:
        """Keys, values (B, H, S, D) at positions start.. (S a multiple of unit) -> one Chunk per unit tokens."""
        return self._chunks(self.quantize(keys, values, start), keys, values, start, unit)

    def archive(self, keys: torch.Tensor, values: torch.Tensor, start: int, unit: int):
        """encode, and what decode of those chunks gives, computed from the codes (no entropy decoding).

        -> (chunks, (keys, values) in keys' dtype), the decoded tensors bit for bit those of decode(chunks):
        ANS is lossless, so the stored streams decode to these very codes, and both paths run the same ops.
        """
        codes = self.quantize(keys, values, start)
        chunks = self._chunks(codes, keys, values, start, unit)
        sinks = self._sinks(start, keys.shape[2])
        sink_parts = [c.sink for c in chunks if c.sink]
        return chunks, self._reconstruct(codes[:, sinks:].contiguous(), sink_parts, start, keys.dtype)

    def quantize(self, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
        """Keys, values (B, H, S, D) at positions start.. -> (B, S, r) int32 codes, within what a stream can hold."""
        codes = ecsq((self.rows(keys, values, start) - self.mean) @ self.enc, self.step)
        return codes.clamp_(-(ESCAPE_RANGE // 2), ESCAPE_RANGE // 2 - 1)  # escapes store 16 bits (codecs/ans.py)

    def _sinks(self, start: int, tokens: int) -> int:
        """How many of `tokens` tokens from position start are sink tokens (coded apart)."""
        return min(max(self.sink_tokens - start, 0), tokens)

    def _chunks(self, codes: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, unit: int):
        """(B, S, r) codes of the tokens from position start -> one Chunk per unit tokens (streams coded together)."""
        sinks = self._sinks(start, keys.shape[2])
        parts, sink_parts = [], []
        for first in range(0, keys.shape[2], unit):
            lo = max(first, sinks)  # sink rows are not PCA-coded
            sink = None
            if lo > first:
                sink = (SINK_CODEC.encode(keys[:, :, first:lo]), SINK_CODEC.encode(values[:, :, first:lo]))
            parts.append(codes[:, lo : first + unit].reshape(-1, self.kept))
            sink_parts.append(sink)
        return [Chunk(stream, sink) for stream, sink in zip(self.table.encode_many(parts), sink_parts)]

    def decode(self, chunks: list[Chunk], start: int, unit: int, batch: int, dtype: torch.dtype):
        """Inverse of encode: chunks of unit tokens from position start -> keys, values (B, H, S, D) in dtype."""
        rows = [unit - (chunk.sink[0].shape[2] if chunk.sink else 0) for chunk in chunks]
        decoded = self.table.decode_many([chunk.stream for chunk in chunks], [batch * r for r in rows])
        codes = [part.view(batch, r, self.kept) for part, r in zip(decoded, rows)]
        return self._reconstruct(torch.cat(codes, dim=1), [c.sink for c in chunks if c.sink], start, dtype)

    def _reconstruct(self, codes: torch.Tensor, sinks: list[tuple[Encoded, Encoded]], start: int,
                     dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, S', r) contiguous codes after the sink tokens, and the sinks' encodings -> keys, values (B, H, S, D)."""
        y = codes.float() * self.step  # (B, S', r)
        count = sum(sink[0].shape[2] for sink in sinks)
        keys, values = self.unrows(y @ self.dec + self.mean, start + count)
        if count:
            sink_keys = torch.cat([SINK_CODEC.decode(k) for k, _ in sinks], dim=2).float()
            sink_values = torch.cat([SINK_CODEC.decode(v) for _, v in sinks], dim=2).float()
            keys, values = torch.cat([sink_keys, keys], dim=2), torch.cat([sink_values, values], dim=2)
        return keys.to(dtype), values.to(dtype)

    def state(self) -> dict:
        """Tensors and numbers to save (loaded back with from_state)."""
        return {
            "mean": self.mean, "enc": self.enc, "dec": self.dec, "step": self.step, "table": self.table.state(),
            "heads": self.heads, "head_dim": self.head_dim, "rope_theta": self.rope.theta,
            "sink_tokens": self.sink_tokens, "component_bits": self.component_bits,
        }

    @classmethod
    def from_state(cls, state: dict) -> LayerCoder:
        return cls(
            state["mean"], state["enc"], state["dec"], state["step"], EntropyTable.from_state(state["table"]),
            state["heads"], state["head_dim"], Rope(state["head_dim"], state["rope_theta"]),
            state["sink_tokens"], state["component_bits"],
        )
