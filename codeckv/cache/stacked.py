"""StackedCache: several caches side by side in one batch, so that one forward feeds them all.

    caches = [DynamicCache(config=config), make_cache(config, "turbo-4"), make_cache(config, "png")]
    stacked = StackedCache(caches, rows=2)              # batch rows 0-1 -> caches[0], 2-3 -> caches[1], ...
    use_codec_attention(model)                          # codeckv.load_model has done it already
    model(input_ids=ids.repeat(3, 1), cache=stacked)    # every cache sees its own copy of the same tokens

On a CPU a small model's decode step is bound by reading its weights, so one forward of many caches
costs far less than one forward each (measure/lockstep.py; the README, "Tiers and what they cost", times it).

Each layer of the stack hands every member its own `rows` rows of the new keys and values and
returns shape-only "meta" tensors tagged with the members' outputs. codeckv.cache.attention then runs
attention once per member, on that member's rows only, exactly the call the member would get alone:
no concatenated copy of the cache, and no member's attention depends on the others (CPU attention
splits its work by batch, so one shared call would round each row differently by its place in the
batch). The matrix products of the rest of the model round each row the same way whatever its
place, so two members holding identical tokens (native and a lossless tier) give bitwise identical
log-probs. Members hold the same tokens (they are fed the same ids) and keep their own layer
types: a CodecLayer, a CodedLayer, a DynamicLayer, a sliding-window layer.

`member_seconds` adds up, per member, the time of its own cache work: its updates and its attention (which
archives what its new tokens completed). The rest of a forward (the weights' products) serves every member.
"""

from __future__ import annotations

import time

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

STACK_TAG = "codeckv_stack"  # attribute of the meta keys a StackedLayer returns: [(keys, values) per member]
CLOCK_TAG = "codeckv_stack_clock"  # and the stack's member_seconds, which its attention adds each member's time to


class StackedLayer(CacheLayerMixin):
    """One model layer of a StackedCache: the same layer of every member cache."""

    def __init__(self, members: list[CacheLayerMixin], rows: int, member_seconds: list[float]) -> None:
        super().__init__()
        self.members = members
        self.rows = rows
        self.member_seconds = member_seconds  # the stack's: shared by its layers
        self.is_sliding = getattr(members[0], "is_sliding", False)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Each member takes its `rows` rows of the new (B, H, T, D) states; returns tagged meta tensors."""
        if key_states.shape[0] != self.rows * len(self.members):
            raise ValueError(f"a stack of {len(self.members)} caches x {self.rows} rows takes a batch of "
                             f"{self.rows * len(self.members)} rows, got {key_states.shape[0]}")
        self.is_initialized = True
        outputs = []
        for index, (member, k, v) in enumerate(zip(self.members, key_states.split(self.rows),
                                                   value_states.split(self.rows))):
            start = time.perf_counter()
            outputs.append(member.update(k, v, *args, **kwargs))
            self.member_seconds[index] += time.perf_counter() - start
        b, h, _, d = key_states.shape
        length = outputs[0][0].shape[2]
        keys = torch.empty((b, h, length, d), dtype=key_states.dtype, device="meta")
        values = torch.empty((b, h, length, value_states.shape[3]), dtype=value_states.dtype, device="meta")
        setattr(keys, STACK_TAG, outputs)
        setattr(keys, CLOCK_TAG, self.member_seconds)
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.members[0].get_mask_sizes(query_length)

    def get_seq_length(self) -> int:
        return self.members[0].get_seq_length()

    def get_max_length(self) -> int:
        return self.members[0].get_max_length()

    def reset(self) -> None:
        for member in self.members:
            member.reset()
        self.is_initialized = False


class StackedCache(Cache):
    """Member caches of one model, each owning `rows` consecutive rows of the batch, in order."""

    def __init__(self, caches: list[Cache], rows: int) -> None:
        if not caches or rows < 1:
            raise ValueError(f"stack at least one cache of at least one row, got {len(caches)} caches x {rows} rows")
        depths = {len(cache.layers) for cache in caches}
        if len(depths) != 1 or 0 in depths:
            raise ValueError(f"the caches must have the same, known number of layers (build them from the model's "
                             f"config), got {sorted(depths)}")
        self.member_seconds = [0.0] * len(caches)  # per member: its own cache work so far (module docstring)
        super().__init__(layers=[StackedLayer(list(members), rows, self.member_seconds)
                                 for members in zip(*(c.layers for c in caches))])
