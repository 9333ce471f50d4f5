"""A press's side of a cache layer: which held tokens it evicts, and where the ones it kept sit.

CodecLayer and CodedLayer take this mixin. After a prefill's attention (codeckv.cache.attention calls
`press(queries, rope_at)` on the layer its keys are tagged with), the tier's press (codeckv/presses/) picks, per KV
head, the tokens of that prefill to keep; the layer drops the others, so their bytes are freed, and remembers each
kept token's position. Which prefills are pressed is the layer's `press_mode` (presses/base.py PRESS_MODES): "once",
the first forward into the empty layer (the context; kvpress's protocol), or "chunked", every prefill chunk as it
arrives. A token budget (presses/budget.py) presses everything held back to its size every `interval` decode
steps, whatever the mode, and keeps the last queries its press reads; a decoding press (presses/decoding.py,
kvpress's DecodingPress) leaves the context's prefill alone and compresses every `interval` later forwards, with
the queries of its last `buffer` forwards.

The layer supplies what a press acts on: `held`, `length`, `first`, `tier`, `window`, `keys`, `device`,
`_chunk(n)` (the last n held tokens, less the sinks, as (B, H, t, D) keys and values), `_keep(n, keep)` (keep those
of them at `keep`) and `_held_changed()`. Its `_reset_state` calls `_reset_press`.
"""

from __future__ import annotations

import torch

from codeckv.cache.rope import RotaryAt
from codeckv.presses import Budget, Decoding, Rope, check_press_mode, keep_indices

PRESS_TAG = "codeckv_press"  # attribute of the keys a pressing layer returns (codeckv.cache.attention reads it)


def gather_tokens(tokens: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """tokens (B, H, t, D) at positions keep (B, H, k) of each head: (B, H, k, D)."""
    return tokens.gather(2, keep[..., None].expand(-1, -1, -1, tokens.shape[3]))


class PressedLayer:
    """Mixin: a layer whose tier's press evicts tokens (module docstring); a no-op for a tier without one."""

    press_mode = "once"  # when the press acts: presses/base.py PRESS_MODES (set_press_mode)

    def set_press_mode(self, mode: str) -> None:
        """Press the context once (kvpress's protocol) or every prefill chunk as it arrives (PRESS_MODES)."""
        self.press_mode = check_press_mode(mode)

    def _reset_press(self) -> None:
        self.evicted = 0  # tokens a press evicted (the positions of the next tokens are length + evicted)
        self._pressable = 0  # the prefill chunk just taken, which its press evicts from after its attention
        self._positions: torch.Tensor | None = None  # (B, H, held) position of each held token, once a press evicted
        self._queries: torch.Tensor | None = None  # (B, Hq, q, D) a budget's last queries (Press.queries_read)
        self._buffered: list[torch.Tensor] = []  # a decoding press's queries, one (B, Hq, t, D) per forward
        self._steps = 0  # a decoding press's forwards since its last compression

    def _pressed_after(self, new: int, keys: torch.Tensor, values: torch.Tensor):
        """keys, values; tagged with this layer (PRESS_TAG) for codeckv's attention to call press() after attending,
        when its tier's press evicts from a prefill chunk of `new` tokens."""
        if self._positions is not None:  # the new tokens' positions follow every token seen
            b, h, _ = self._positions.shape
            seen = self.length + self.evicted
            fresh = torch.arange(seen - new, seen, device=self._positions.device).expand(b, h, new)
            self._positions = torch.cat([self._positions, fresh], dim=2)
        budget = isinstance(self.tier.press, Budget)  # a budget sees every step's queries: it keeps the last ones
        first = self.length + self.evicted == new  # the first forward into the empty layer: the context's prefill
        when = budget or (new > 1 and (first or self.press_mode == "chunked"))
        if isinstance(self.tier.press, Decoding):  # kvpress's DecodingPress: never the prefill, every later forward
            when = not first
        self._pressable = new if self.tier.press is not None and when and self.window is None else 0
        if self._pressable:
            setattr(keys, PRESS_TAG, self)
        return keys, values

    @torch.inference_mode()
    def press(self, queries: torch.Tensor, rope_at: RotaryAt | None = None) -> None:
        """Evict the tier's press's share of the prefill just attended to (queries (B, Hq, T, D), the prefill's;
        rope_at: the model's rotary embedding for this layer, codeckv/cache/rope.py): its raw tokens after the sinks,
        the same count in every KV head (codeckv/presses/base.py)."""
        chunk, self._pressable = self._pressable, 0
        keep_count = None
        if isinstance(self.tier.press, Decoding):
            if not self._decoding_due(queries, chunk):
                return
            chunk, queries = self.held, torch.cat(self._buffered, dim=2)
            keep_count = self.tier.press.target(self.length + self.evicted) - min(self.length, self.tier.keep_first)
            self._buffered = []
        elif isinstance(self.tier.press, Budget):  # every token held is scored, with the last queries kept
            wanted = self.tier.press.queries_read
            recent = queries if self._queries is None else torch.cat([self._queries, queries], dim=2)
            self._queries = recent[:, :, recent.shape[2] - wanted :].clone() if wanted else None
            if not self.tier.press.over(self.held, chunk):
                return
            chunk, queries = self.held, recent
            keep_count = self.tier.press.tokens - min(self.length, self.tier.keep_first)  # the sinks stay
        keys, values = self._chunk(chunk)
        tokens = keys.shape[2]
        if tokens < 2:
            return
        seen = self.length + self.evicted  # the position the next token takes
        rope = Rope(rope_at, seen, rope_at.interleaved) if rope_at is not None else None
        keep = keep_indices(self.tier.press, keys, values, queries[:, :, -tokens:], keep_count, rope)  # (B, H, k)
        positions = self.positions()
        start = positions.shape[2] - tokens
        self._positions = torch.cat([positions[:, :, :start], positions[:, :, start:].gather(2, keep)], dim=2)
        self._keep(tokens, keep)
        self.length -= tokens - keep.shape[2]
        self.evicted += tokens - keep.shape[2]
        self._held_changed()

    def _decoding_due(self, queries: torch.Tensor, new: int) -> bool:
        """A decoding press's step (presses/decoding.py): buffer this forward's queries, count it; True when it
        compresses now, with more tokens held than its target (the count restarts either way)."""
        press = self.tier.press
        self._buffered.append(queries)
        self._steps += 1
        seen = self.length + self.evicted
        if not press.due(self._steps, new, seen):
            self._buffered = self._buffered[-press.buffer:] if press.buffer else []
            return False
        self._steps = 0
        if self.held > press.target(seen):
            return True
        self._buffered = []
        return False

    def press_context(self, queries: torch.Tensor, rope_at: RotaryAt | None = None) -> None:
        """Press every token this layer holds as the context's prefill, just attended to by `queries` (B, Hq, S, D):
        the "once" protocol applied to tokens the layer adopted (CodecCache.from_cache) instead of prefilling."""
        if self.tier.press is None or self.window is not None or self.evicted:
            return
        self._pressable = self.held
        self.press(queries, rope_at)

    def positions(self) -> torch.Tensor:
        """(B, H, held) the position of every held token of each head, in order (a press's kept ones)."""
        if self._positions is not None:
            return self._positions
        b, h = self.keys.shape[:2]
        return torch.arange(self.first, self.first + self.held, device=self.device).expand(b, h, self.held)

    def _press_bytes(self) -> int:
        """What a press keeps beside the tokens: each kept token's position, a budget's last queries."""
        kept = [self._positions, self._queries, *self._buffered]
        return sum(t.numel() * t.element_size() for t in kept if t is not None)
