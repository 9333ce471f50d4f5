"""What a full RULER run costs on a cluster, computed from this machine's measured per-sample costs.

    .venv/bin/python scripts/ruler_cost.py assets/ruler-qwen2.5-coder-0.5b-samples.csv --model qwen2.5-coder-0.5b \
        --length 4096 --target llama-3.1-8b --samples 500 --lengths 4096 8192 16384 --gpus 8 64

Measured, from a samples CSV of `python -m codeckv ruler` at --length on one node kind: the median native prefill of
a sample (`prefill_seconds`) and the median over samples of every tier's own seconds summed (its cache built from the
prefill, the question, its share of the decode steps), with the number of tiers. Scaled, with the arithmetic printed:
- prefill is bound by arithmetic: FLOPs = 2 x non-embedding parameters x T + 2 x layers x heads x head_dim x T^2
  (causal QK^T and AV), so a sample of the target at T costs the measured prefill x FLOPs(target, T) / FLOPs(here);
- decoding is bound by reading memory: a step of every tier reads the weights once (the tiers ride one batch) and
  each tier's cache, so the tiers' seconds scale with the bytes a step reads;
- on a GPU, prefill runs at an assumed share (--mfu) of the GPU's dense bf16 peak and a decode step at an assumed share
  (--bandwidth-share) of its HBM bandwidth, for the task's whole answer budget (an upper bound: answers stop at end
  of turn, or once every expected string is found). Those two shares are assumptions, not measurements: no GPU was
  lent here; `scripts/gpu_check.sh` on one would replace them.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# RULER's 13 tasks and their answer budgets (tokens_to_generate, synthetic.yaml): 8 needles, vt, cwe, fwe, 2 QA
ANSWER_BUDGETS = {**{f"niah_{n}": 128 for n in ("single_1", "single_2", "single_3", "multikey_1", "multikey_2",
                                                "multikey_3", "multivalue", "multiquery")},
                  "vt": 30, "cwe": 120, "fwe": 50, "qa_1": 32, "qa_2": 32}


@dataclass
class Geometry:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    def non_embedding_params(self) -> float:
        attention = self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        return self.layers * (attention + 3 * self.hidden * self.intermediate)

    def prefill_flops(self, tokens: int) -> float:
        return 2 * self.non_embedding_params() * tokens + 2 * self.layers * self.heads * self.head_dim * tokens ** 2

    def weight_bytes(self) -> float:  # bf16, the embedding read once per step as the LM head
        return 2 * (self.non_embedding_params() + self.vocab * self.hidden)

    def kv_bytes(self, tokens: int) -> float:  # a bf16 cache of `tokens`
        return 2 * 2 * self.layers * self.kv_heads * self.head_dim * tokens


TARGETS = {  # from their config.json
    "llama-3.1-8b": Geometry("Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256),
    "qwen3-8b": Geometry("Qwen3-8B", 36, 4096, 32, 8, 128, 12288, 151936),
}
ROW = {"task": "niah_multikey_3", "length": 16384, "sample": 123, "tier": "snapkv-50+turbo-4", "score": 100.0,
       "seconds": 12.345678901234, "prefill_seconds": 40.1234567, "stored_vs_bf16": 0.296875, "held_bytes": 15303552,
       "prompt_tokens": 16200, "press_mode": "once", "seed": 0, "haystack": "bible", "node": "host/0123abcd",
       "node_kind": "NVIDIA H100 80GB HBM3"}  # a samples CSV's row, as long as they come
GPUS = {"h100": (989e12, 3.35e12, 80 * 2**30), "h200": (989e12, 4.8e12, 141 * 2**30)}  # bf16 dense, HBM B/s, memory


def here_geometry(model: str) -> Geometry:
    from codeckv.models import model_config

    c = model_config(model).get_text_config(decoder=True)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return Geometry(model, c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                    head_dim, c.intermediate_size, c.vocab_size)


def measured(path: Path, length: int) -> tuple[float, float, int, int, str]:
    """(median prefill s, median tiers' own s per sample, tiers, samples, node kind) at `length`."""
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(r["length"]) == length]
    samples: dict[tuple, list[dict]] = {}
    for row in rows:
        samples.setdefault((row["task"], row["sample"]), []).append(row)
    prefill = statistics.median(float(group[0]["prefill_seconds"]) for group in samples.values())
    own = statistics.median(sum(float(r["seconds"]) for r in group) for group in samples.values())
    tiers = max(len(group) for group in samples.values())
    return prefill, own, tiers, len(samples), rows[0].get("node_kind", "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path, help="a samples CSV of python -m codeckv ruler")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="the model the CSV measured")
    parser.add_argument("--length", type=int, default=4096, help="the length of the CSV's rows to read")
    parser.add_argument("--target", choices=TARGETS, default="llama-3.1-8b")
    parser.add_argument("--samples", type=int, default=500, help="samples per task and length (RULER: 500)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--gpu", choices=GPUS, default="h100")
    parser.add_argument("--gpus", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--mfu", type=float, default=0.4, help="assumed share of the bf16 peak in prefill")
    parser.add_argument("--bandwidth-share", type=float, default=0.7, help="assumed share of HBM bandwidth in decode")
    args = parser.parse_args()

    here, target = here_geometry(args.model), TARGETS[args.target]
    prefill, own, tiers, n, node = measured(args.csv, args.length)
    peak, bandwidth, memory = GPUS[args.gpu]
    tasks = len(ANSWER_BUDGETS)
    mean_budget = statistics.fmean(ANSWER_BUDGETS.values())
    here_step = here.weight_bytes() + tiers * here.kv_bytes(args.length)
    print(f"Measured: {args.model} at {args.length:,} tokens, {n} samples x {tiers} tiers (native included) on "
          f"{node}: native prefill {prefill:.1f} s (median), the tiers' own work {own:.1f} s a sample (median).")
    print(f"Here: {here.prefill_flops(args.length) / 1e12:.2f} TFLOP a prefill -> "
          f"{here.prefill_flops(args.length) / prefill / 1e9:.1f} GFLOP/s achieved; a decode step of {tiers} tiers "
          f"reads {here_step / 2**20:.0f} MiB (bf16).")
    print(f"\nTarget {target.name}: {target.non_embedding_params() / 1e9:.2f} B non-embedding parameters, "
          f"{target.weight_bytes() / 2**30:.1f} GiB of bf16 weights a step, {target.kv_bytes(1) / 1024:.0f} KiB of "
          f"bf16 KV per token. RULER: {tasks} tasks (mean answer budget {mean_budget:.0f} tokens), "
          f"{args.samples} samples each, {tiers} tiers a sample.\n")
    print("| length | prefill TFLOP | this node kind, a sample | GPU prefill | GPU decode (budget) | GPU a sample | "
          f"{args.gpu.upper()} hours, all samples | peak memory a worker |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    total_gpu_seconds = total_node_seconds = 0.0
    for length in args.lengths:
        flops = target.prefill_flops(length)
        step = target.weight_bytes() + tiers * target.kv_bytes(length)
        node_sample = prefill * flops / here.prefill_flops(args.length) + own * step / here_step
        gpu_prefill = flops / (args.mfu * peak)
        gpu_decode = mean_budget * step / (args.bandwidth_share * bandwidth)
        gpu_sample = gpu_prefill + gpu_decode
        seconds = gpu_sample * tasks * args.samples
        total_gpu_seconds += seconds
        total_node_seconds += node_sample * tasks * args.samples
        worst = target.weight_bytes() + tiers * target.kv_bytes(length)  # every tier's cache raw: an upper bound
        print(f"| {length:,} | {flops / 1e12:.0f} | {node_sample / 3600:.2f} h | {gpu_prefill:.2f} s | "
              f"{gpu_decode:.2f} s | {gpu_sample:.2f} s | {seconds / 3600:.1f} | {worst / 2**30:.0f} GiB of "
              f"{memory / 2**30:.0f} |")
    print(f"\nAll lengths: {total_gpu_seconds / 3600:.1f} {args.gpu.upper()}-hours (prefill at {args.mfu:.0%} of "
          f"{peak / 1e12:.0f} TFLOP/s, decode at {args.bandwidth_share:.0%} of {bandwidth / 1e12:.2f} TB/s: assumed).")
    print(f"On nodes like this one: {total_node_seconds / 3600 / 24 / 365:.1f} node-years. A GPU's host work (kernel "
          "launches, the codec layers' Python per step and layer) is not in the GPU figures: they are lower bounds.")
    cells = tasks * args.samples * len(args.lengths)
    append = _append_seconds(tiers)
    for gpus in args.gpus:
        wall = total_gpu_seconds / gpus
        print(f"- {gpus} GPUs, one worker each: {wall / 3600:.2f} h wall; the driver receives "
              f"{cells * gpus / total_gpu_seconds:.1f} cells/s ({cells:,} cells, {cells * tiers:,} rows)")
    rewrite = _rewrite_seconds(cells * tiers)
    print(f"The driver appends a cell's {tiers} rows in {append * 1e3:.2f} ms here (measured now): it keeps up to "
          f"about {1 / append:,.0f} cells/s; rewriting all {cells * tiers:,} rows once (the sort at the end) takes "
          f"{rewrite:.1f} s, which a driver rewriting per cell would pay at every cell.")


def _rewrite_seconds(rows: int) -> float:
    """Seconds the grid runner takes to write a CSV of `rows` rows whole (codeckv/grid/runner.py's write_rows)."""
    import tempfile
    import time

    from codeckv.grid.runner import write_rows

    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        write_rows([dict(ROW) for _ in range(rows)], Path(folder) / "samples.csv")
        return time.perf_counter() - start


def _append_seconds(tiers: int) -> float:
    """The median time the grid runner takes to append one cell's rows to a CSV of many (codeckv/grid/runner.py)."""
    import tempfile
    import time

    from codeckv.grid.runner import append_rows

    with tempfile.TemporaryDirectory() as folder:
        path, times = Path(folder) / "samples.csv", []
        for _ in range(200):
            start = time.perf_counter()
            append_rows([dict(ROW) for _ in range(tiers)], path)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


if __name__ == "__main__":
    main()
