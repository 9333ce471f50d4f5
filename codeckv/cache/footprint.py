"""Bytes a cache holds, per layer and in total (design.md): archive, resident and the bf16 reference.

    fp = cache.footprint()
    fp.ratio                   # archive bytes / bytes of a bf16 native cache of the same tokens
    fp.steady_state_ratio      # bytes per archived token (codes + metadata) / bf16 bytes per token
    fp.archived_tokens, fp.sink_tokens, fp.window_tokens, fp.tail_tokens   # what is behind `ratio`

A codec layer holds its tokens as [ sinks | archived blocks | raw tail + recent window ]: only the
archived ones are encoded, the rest stays at the model's precision. `ratio` is what this cache
stores now; `steady_state_ratio` is what every further archived token costs, so a short prompt (all
raw tail) and a long document (almost all archived) can be told apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class LayerFootprint:
    """Bytes one layer holds for its tokens (K and V together), and how its tokens are held."""

    layer: int
    kind: str  # "codec", or the class name of a native layer
    full_attention: bool  # counted in the totals (codec_cache.footprint says which); other layers are counted apart
    tokens: int
    archive_bytes: int  # everything a codec cache must keep: codes, scales, zeros, anchors, raw tokens
    resident_bytes: int  # archive + materialized view + capacity slack: what is really allocated
    bf16_bytes: int  # a bf16 native cache of the same tokens: 2 x B x H x S x D x 2
    archived_tokens: int = 0  # tokens stored by the codec
    code_bytes: int = 0  # bytes of those archived tokens only (codes and their metadata)
    sink_tokens: int = 0  # raw: the keep_first sinks
    window_tokens: int = 0  # raw: the keep_recent window
    tail_tokens: int = 0  # raw: the incomplete archive unit (a native layer: every token)
    reference_tokens: int = 0  # the tokens a native layer holds here, which bf16_bytes count (0: `tokens`)
    evicted_tokens: int = 0  # tokens a press evicted: gone from `tokens`, counted in a native layer's

    @property
    def archived_bf16_bytes(self) -> int:
        """What a bf16 native cache takes for the archived tokens."""
        reference = self.reference_tokens or self.tokens
        return self.bf16_bytes * self.archived_tokens // reference if reference else 0


@dataclass
class Footprint:
    """Cache-wide bytes, split into codec-carrying layers and native-only layers (design.md)."""

    layers: list[LayerFootprint] = field(default_factory=list)

    def _sum(self, attr: str, full_attention: bool = True) -> int:
        return sum(getattr(f, attr) for f in self.layers if f.full_attention == full_attention)

    @property
    def archive_bytes(self) -> int:
        return self._sum("archive_bytes")

    @property
    def resident_bytes(self) -> int:
        return self._sum("resident_bytes")

    @property
    def bf16_bytes(self) -> int:
        return self._sum("bf16_bytes")

    @property
    def native_layer_bytes(self) -> int:
        """Bytes held by the layers counted apart: native layers a tier does not code (linear attention, a PCA
        tier's sliding windows)."""
        return self._sum("resident_bytes", False)

    @property
    def kept_share(self) -> float:
        """Tokens the counted layers hold / tokens they have seen: 1.0 unless a press evicted some."""
        held = self._sum("tokens")
        seen = sum(f.reference_tokens or f.tokens for f in self.layers if f.full_attention)
        return held / seen if seen else 1.0

    def stored_ratio(self, coded: bool) -> float:
        """What the cache stores per token seen vs bf16, every family alike (the Pareto charts' axis): the share of
        the tokens it keeps times the bytes per token of its format, bf16 for raw tokens (`coded` False: native, a
        press alone) and the steady state for coded ones."""
        return self.kept_share * (self.steady_state_ratio if coded else 1.0)

    @property
    def ratio(self) -> float:
        """Archive bytes of the codec layers as a fraction of a bf16 cache of the same tokens."""
        return self.archive_bytes / self.bf16_bytes if self.bf16_bytes else math.nan

    @property
    def steady_state_ratio(self) -> float:
        """Bytes per archived token / bf16 bytes per token (nan until something is archived). A full-attention layer
        a schedule leaves native (vLLM's boundary layers) costs a bf16 token's bytes per token: the layers' ratios
        weighted by their bf16 bytes per token."""
        reference = self._sum("archived_bf16_bytes")
        if not reference:
            return math.nan
        native = [f for f in self.layers if f.full_attention and f.kind == "DynamicLayer" and f.tokens]
        if not native:
            return self._sum("code_bytes") / reference
        coded = [f for f in self.layers if f.full_attention and f.archived_tokens]
        bf16_per_token = [f.bf16_bytes / (f.reference_tokens or f.tokens) for f in (*coded, *native)]
        stored = sum(f.code_bytes / f.archived_tokens for f in coded) + sum(bf16_per_token[len(coded):])
        return stored / sum(bf16_per_token)

    def _tokens(self, attr: str) -> int:
        """A token count of the first counted layer (every full-attention codec layer holds the same tokens)."""
        return next((getattr(f, attr) for f in self.layers if f.full_attention), 0)

    @property
    def tokens(self) -> int:
        return self._tokens("tokens")

    @property
    def archived_tokens(self) -> int:
        return self._tokens("archived_tokens")

    @property
    def sink_tokens(self) -> int:
        return self._tokens("sink_tokens")

    @property
    def window_tokens(self) -> int:
        return self._tokens("window_tokens")

    @property
    def tail_tokens(self) -> int:
        return self._tokens("tail_tokens")
