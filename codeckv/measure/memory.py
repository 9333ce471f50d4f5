"""What a cache really holds over a turn: held, its peak, at rest, and the process's peak (design.md "Memory").

    rows = memory_rows(loaded, ["turbo-4", "pca-8x"], contexts=[1024, 4096], new_tokens=64)   # in process
    row = memory_row_isolated("smollm2-135m", "turbo-4", "codes", 4096, 64)                   # its own process

One turn per row: `context` corpus tokens prefilled through the cache in PREFILL_CHUNK-token forwards,
then `new_tokens` greedy tokens. A press evicts from every chunk as it arrives (press_mode "chunked", the
memory-bounded streaming protocol: its peak is what it kept plus one chunk). A row's cache is native, a tier on its
stored codes ("codes", no decoded view) or a tier with a decoded view ("view"), built as make_cache builds it: each
layer holds its tokens raw
until the tier's archive pays off (`raw_until`, codeckv/cache/layers.py "Raw until N"). Measured for the same
tokens:

- held: bytes of every tensor the cache owns at the end (exact, from the tensors: codeckv.cache.held_bytes);
- peak held: the most those tensors took after any forward of the turn (the raw prompt chunk included);
- at rest: what the cache holds once compacted between turns (a view dropped: archive + raw tokens);
- process peak (memory_row_isolated only, one fresh process per row): CUDA, the allocator's peak over the
  turn; CPU, the growth of the process's peak RSS (VmHWM, reset before the turn) over its RSS before it:
  weights are loaded and warm before, so what grows is the cache, activations and allocator slack.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from codeckv.cache import CodecCache, footprint, held_bytes, make_cache, view_reason
from codeckv.corpus import corpus_windows
from codeckv.loaded import LoadedModel
from codeckv.measure.generate import next_logits
from codeckv.tiers import TIERS, Tier, get_tier

PREFILL_CHUNK = 512  # prompt tokens per forward, as in the chat
MODES = ("native", "codes", "view")


@dataclass
class MemoryRow:
    tier: str
    mode: str  # MODES: native cache, attention on the stored codes, or a decoded view
    context: int  # prompt tokens
    tokens: int  # tokens the cache holds at the end (prompt + generated, less the last one not fed)
    held_bytes: int  # every tensor the cache owns at the end
    peak_held_bytes: int  # the most they took after any forward
    at_rest_bytes: int  # held once compacted between turns
    archive_bytes: int  # footprint().archive_bytes: what the codec must keep (codes + raw tokens)
    bf16_bytes: int  # a bf16 native cache of the same tokens
    seconds: float  # the whole turn
    raw_until: int | None  # tokens the codec layers hold raw before archiving (the largest); None: native, or never
    archived_tokens: int  # tokens its codec layers hold archived at the end (0: all raw, as native)
    process_peak_bytes: int = -1  # memory_row_isolated: CUDA allocator peak, or CPU peak-RSS growth (-1: not measured)
    process_peak_source: str = ""


def modes_of(tier: Tier) -> list[str]:
    """The modes a tier runs in: native alone, else the codes where a kernel reads them, and the view."""
    if tier.is_native:
        return ["native"]
    return (["codes"] if view_reason(tier) is None else []) + ["view"]


@torch.inference_mode()
def memory_row(loaded: LoadedModel, tier: Tier, mode: str, context: int, new_tokens: int = 64,
               ids: torch.Tensor | None = None) -> MemoryRow:
    """One turn of `tier` in `mode` on `context` corpus tokens (or `ids`, (1, >= context)), measured."""
    if mode not in modes_of(tier):
        raise ValueError(f"tier {tier.name!r} does not run in mode {mode!r} (allowed: {', '.join(modes_of(tier))})")
    if ids is None:
        ids = corpus_windows(loaded.tokenizer, 1, context)
    ids = ids[:, :context].to(loaded.model.device)
    cache = make_cache(loaded, tier, materialization_free={"native": None, "codes": True, "view": False}[mode],
                       raw_until=None, press_mode="chunked")  # raw until the tier's own N, as the Chat builds it
    start = time.perf_counter()
    peak = 0
    for lo in range(0, context, PREFILL_CHUNK):
        logits = next_logits(loaded.model, ids[:, lo : lo + PREFILL_CHUNK], cache)
        peak = max(peak, held_bytes(cache))
    for _ in range(new_tokens - 1):  # the last generated token is not fed back
        logits = next_logits(loaded.model, logits.argmax(-1, keepdim=True), cache)
        peak = max(peak, held_bytes(cache))
    if loaded.model.device.type == "cuda":
        torch.cuda.synchronize(loaded.model.device)
    seconds = time.perf_counter() - start
    fp = footprint(cache)
    held = held_bytes(cache)
    at_rest, raw_until = held, None
    if isinstance(cache, CodecCache):
        until = list(cache.raw_until.values())
        raw_until = None if None in until else max(until)
        cache.compact()
        at_rest = held_bytes(cache)
    return MemoryRow(tier.name, mode, context, fp.tokens, held, max(peak, held), at_rest, fp.archive_bytes,
                     fp.bf16_bytes, seconds, raw_until, fp.archived_tokens)


def memory_rows(loaded: LoadedModel, tiers: list[Tier], contexts: list[int], new_tokens: int = 64,
                progress: Callable[[int, int, str], None] | None = None) -> list[MemoryRow]:
    """memory_row for native and every tier in each of its modes, at every context, in this process."""
    plan = [(t, m, c) for c in contexts for t in [TIERS["native"], *[t for t in tiers if not t.is_native]]
            for m in modes_of(t)]
    ids = corpus_windows(loaded.tokenizer, 1, max(contexts))
    rows = []
    for done, (tier, mode, context) in enumerate(plan):
        if progress:
            progress(done, len(plan), f"{tier.name} ({mode}) at {context:,} tokens")
        rows.append(memory_row(loaded, tier, mode, context, new_tokens, ids))
    return rows


def beside_native(rows: list[MemoryRow]) -> list[dict]:
    """Rows as dicts with each one's held and peaks against the native row of the same context.

    held_vs_native = held / native held; peak_saving_of_native = (native's peak - this peak) / native held,
    for the peak held and (where measured) the process peak: the issue's "70% of the native cache below".
    """
    native = {r.context: r for r in rows if r.mode == "native"}
    out = []
    for row in rows:
        ref = native.get(row.context)
        item = asdict(row)
        item["held_vs_native"] = row.held_bytes / ref.held_bytes if ref else float("nan")
        item["peak_held_saving_of_native"] = ((ref.peak_held_bytes - row.peak_held_bytes) / ref.held_bytes
                                              if ref else float("nan"))
        measured = ref is not None and row.process_peak_bytes >= 0 and ref.process_peak_bytes >= 0
        item["process_peak_saving_of_native"] = ((ref.process_peak_bytes - row.process_peak_bytes) / ref.held_bytes
                                                 if measured else float("nan"))
        out.append(item)
    return out


def memory_row_isolated(model: str | None, tier: Tier, mode: str, context: int, new_tokens: int = 64) -> MemoryRow:
    """memory_row in a fresh process, with that process's peak memory over the turn (module docstring).

    tier: a preset (the child process rebuilds it from its name).
    """
    request = json.dumps({"model": model, "tier": get_tier(tier.name).name, "mode": mode, "context": context,
                          "new_tokens": new_tokens})
    done = subprocess.run([sys.executable, "-m", "codeckv.measure.memory", request], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])
    if done.returncode != 0:  # the child's own one-line message (a model that cannot load, ...)
        lines = done.stderr.strip().splitlines() or [f"the {tier.name} ({mode}) row at {context} tokens failed"]
        raise RuntimeError(lines[-1].removeprefix("error: "))
    return MemoryRow(**json.loads(done.stdout.strip().splitlines()[-1]))


def proc_status_bytes(field: str, pid: int | str = "self") -> int:
    """A /proc/<pid>/status field (VmRSS, VmHWM) in bytes (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def _isolated(request: dict) -> MemoryRow:
    """The child of memory_row_isolated: load, warm up, reset the peak, run the row, read the peak."""
    from codeckv.cache.calibration import calibration_for
    from codeckv.models import load_model

    loaded = load_model(request["model"])
    ids = corpus_windows(loaded.tokenizer, 1, request["context"])
    tier = get_tier(request["tier"])
    if tier.joint is not None:
        calibration_for(loaded, tier)  # read (or compute) it before the turn is measured
    memory_row(loaded, tier, request["mode"], min(64, request["context"]), 2, ids)  # warm up
    cuda = loaded.model.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(loaded.model.device)
        before = torch.cuda.memory_allocated(loaded.model.device)
    else:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        before = proc_status_bytes("VmRSS")
    row = memory_row(loaded, tier, request["mode"], request["context"], request["new_tokens"], ids)
    if cuda:
        row.process_peak_bytes = torch.cuda.max_memory_allocated(loaded.model.device) - before
        row.process_peak_source = "cuda max_memory_allocated over the turn, less what was allocated before"
    else:
        row.process_peak_bytes = proc_status_bytes("VmHWM") - before
        row.process_peak_source = "peak RSS (VmHWM) growth of a fresh process over the turn (weights loaded before)"
    return row


if __name__ == "__main__":
    try:
        print(json.dumps(asdict(_isolated(json.loads(sys.argv[1])))))
    except (ValueError, RuntimeError, OSError) as err:  # one line for the parent (ModelUnavailableError included)
        print(f"error: {err}".splitlines()[0], file=sys.stderr)
        sys.exit(1)
