"""How far the test suite's cross-shape comparisons move on other CPUs: the float noise its tolerances come from.

    .venv/bin/python scripts/float_noise.py --out assets/float-noise.csv

A test that compares numbers across batch compositions, thread counts or code paths holds on another x86-64
CPU only if its tolerance exceeds what those change. This runs each such comparison of the suite in a fresh
process per configuration, emulating other CPUs on this one: torch threads (1, 2), ATen's vector kernels
(ATEN_CPU_CAPABILITY=avx512 / avx2 / default: the code paths a CPU without AVX-512, or without AVX2, takes) and
MKL's GEMM code path (MKL_CBWR=AUTO, or COMPATIBLE: another blocking, so another summation order). Per
configuration and comparison it prints the largest difference the comparison's test bounds, and writes them
to a CSV; `--configs` picks configurations by name.

Comparisons (the tests they bound):
    split        tests/measure/test_quality.py: a tier scored in one lockstep batch with native vs in a later,
                 smaller batch against the same reference (|Δ KLD|, |Δ ΔNLL%| in points, |Δ top-1| in points)
    stack        tests/measure/test_lockstep.py and tests/cache/test_stacked.py: a cache scored in a stacked
                 batch vs alone (|Δ NLL|, |Δ KLD| per position; logits and keys of a stacked forward)
    order        tests/measure/test_lockstep.py: the same stacked batch in reverse order (bitwise: 0 or not)
    paths        tests/cache/test_attention.py: the predictions of a decoded view vs the stored codes on the same
                 tokens (the largest logit difference; the smallest top-1 margin of the greedy run, in logits)
    drift        the same measurement on each configuration against the first one: what a committed table
                 reads on another CPU (|Δ KLD|, |Δ ΔNLL%| of turbo-4 and jpeg-k2 on 2 x 64 corpus tokens)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {  # name -> environment (torch threads, ATen's vector ISA, MKL's code path)
    "t2-avx512": {"OMP_NUM_THREADS": "2", "ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AUTO"},
    "t1-avx512": {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AUTO"},
    "t2-avx2": {"OMP_NUM_THREADS": "2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AUTO"},
    "t1-default": {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "AUTO"},
    "t2-avx512-mklcompat": {"OMP_NUM_THREADS": "2", "ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "COMPATIBLE"},
    "t1-avx2-mklcompat": {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"},
}
SPLIT_TIERS = ("png", "turbo-4", "jpeg-k2")  # tests/measure/test_quality.py's
STACK_TIERS = ("turbo-4", "jpeg-k2", "int8")  # tests/measure/test_lockstep.py's


def measure() -> dict[str, float]:
    """Every comparison, in this process (its environment is the configuration): name -> largest difference."""
    import torch

    out = {}
    out.update(_split())
    out.update(_stack())
    out.update(_paths())
    out["threads"] = torch.get_num_threads()
    out["capability"] = torch.backends.cpu.get_cpu_capability()
    return out


def _split() -> dict[str, float]:
    import codeckv.measure.quality as quality
    from codeckv.measure.quality import measure_quality
    from codeckv.models import load_model
    from codeckv.tiers import TIERS

    loaded = load_model()
    tiers = [TIERS[name] for name in SPLIT_TIERS]
    together = {r.tier: r for r in measure_quality(loaded, tiers, windows=2, length=64).rows}
    size = quality.stack_size
    quality.stack_size = lambda *args: 2  # [native, png], [turbo-4, jpeg-k2]: the test's split
    try:
        split = {r.tier: r for r in measure_quality(loaded, tiers, windows=2, length=64).rows}
    finally:
        quality.stack_size = size
    out = {}
    for name in SPLIT_TIERS:
        a, b = together[name], split[name]
        out[f"split {name} kld"] = abs(a.kld - b.kld)
        out[f"split {name} delta_nll_pct"] = abs(a.delta_nll_pct - b.delta_nll_pct)
        out[f"split {name} top1_pct"] = abs(a.top1_pct - b.top1_pct)
        out[f"value {name} kld"] = a.kld  # the drift between configurations is computed from these
        out[f"value {name} delta_nll_pct"] = a.delta_nll_pct
    return out


def _tiny_gemma3():
    sys.path.insert(0, str(ROOT))
    from tests.conftest import build_tiny_gemma3

    return build_tiny_gemma3()


def _stack() -> dict[str, float]:
    import torch

    from codeckv.cache import make_cache
    from codeckv.cache.attention import use_codec_attention
    from codeckv.cache.stacked import StackedCache
    from codeckv.measure.lockstep import lockstep

    model = _tiny_gemma3()
    use_codec_attention(model)
    windows = torch.randint(0, 128, (3, 48), generator=torch.Generator().manual_seed(1))
    out = {}
    for on_codes in (False, True):
        mode = "codes" if on_codes else "view"

        def caches(*names, on_codes=on_codes):
            return [make_cache(model.config, name, materialization_free=on_codes) for name in names]

        reference, together = lockstep(model, windows, caches("native", *STACK_TIERS))
        _, reverse = lockstep(model, windows, caches("native", *STACK_TIERS[::-1]))
        for name, stacked, other in zip(STACK_TIERS, together[1:], reverse[:0:-1]):
            out[f"order {mode} {name} nll"] = float((stacked.nll - other.nll).abs().max())
            _, (alone,) = lockstep(model, windows, caches(name), reference=reference)
            out[f"stack {mode} {name} nll"] = float((stacked.nll - alone.nll).abs().max())
            out[f"stack {mode} {name} kld"] = float((stacked.kld - alone.kld).abs().max())
    with torch.inference_mode():  # tests/cache/test_stacked.py: logits and keys of the members vs alone
        ids = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(3))
        names = ("native", "turbo-4")
        alone = [make_cache(model.config, name, materialization_free=False) for name in names]
        want = []
        for cache in alone:
            model(input_ids=ids[:, :32], cache=cache, use_cache=True)
            want.append(torch.cat([model(input_ids=ids[:, t : t + 1], cache=cache).logits for t in range(32, 40)], 1))
        members = [make_cache(model.config, name, materialization_free=False) for name in names]
        stacked = StackedCache(members, rows=2)
        batch = ids.repeat(2, 1)
        model(input_ids=batch[:, :32], cache=stacked, use_cache=True)
        logits = torch.cat([model(input_ids=batch[:, t : t + 1], cache=stacked).logits for t in range(32, 40)], 1)
        for index, (member, single) in enumerate(zip(members, alone)):
            keys = max(float((a.keys - b.keys).abs().max()) for a, b in zip(member.layers, single.layers)
                       if isinstance(a.keys, torch.Tensor) and a.keys.shape == b.keys.shape)
            out[f"stack members {names[index]} keys"] = keys
            out[f"stack members {names[index]} logits"] = float((logits[2 * index : 2 * index + 2]
                                                                 - want[index]).abs().max())
    return out


def _paths() -> dict[str, float]:
    from pydoc_data.topics import topics

    import torch

    from codeckv.cache import CodecCache, make_cache
    from codeckv.models import load_model

    loaded = load_model()
    model = loaded.model
    ids = loaded.tokenizer(topics[sorted(topics)[3]][:1500], return_tensors="pt").input_ids  # test_attention's
    out = {}
    for name in ("png", "jpeg-k8-int8"):
        runs = {}
        for label, cache in (("view", CodecCache.from_config(model.config, name)),
                             ("codes", make_cache(model.config, name, materialization_free=True))):
            gen = model.generate(ids, cache=cache, max_new_tokens=16, min_new_tokens=16, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True)
            runs[label] = (gen.sequences[:, ids.shape[1]:], torch.stack(gen.logits, 1)[0])  # (16,), (16, vocab)
        (view_tokens, view_logits), (code_tokens, code_logits) = runs["view"], runs["codes"]
        top2 = view_logits.topk(2, dim=-1).values
        out[f"paths {name} min_top1_margin"] = float((top2[:, 0] - top2[:, 1]).min())
        same = int((view_tokens == code_tokens).all())
        out[f"paths {name} tokens_equal"] = same
        if same:
            out[f"paths {name} logits"] = float((view_logits - code_logits).abs().max())
    out.update(_gemma3_paths())
    return out


def _gemma3_paths() -> dict[str, float]:
    """tests/cache/test_attention.py's hybrid case: the tiny Gemma 3's view and codes paths on the same tokens."""
    import torch

    from codeckv.cache import CodecCache, make_cache
    from codeckv.cache.attention import use_codec_attention
    from tests.cache.test_attention import _greedy, _predictions

    model = _tiny_gemma3()
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(5))
    tokens = _greedy(model, ids, CodecCache.from_config(model.config, "jpeg-k8-int8"), 24)[0]
    view = _predictions(model, ids, CodecCache.from_config(model.config, "jpeg-k8-int8"), tokens)
    use_codec_attention(model)
    codes = _predictions(model, ids, make_cache(model.config, "jpeg-k8-int8", materialization_free=True), tokens)
    top2 = view.topk(2, dim=-1).values
    return {"paths gemma3 jpeg-k8-int8 logits": float((view - codes).abs().max()),
            "paths gemma3 jpeg-k8-int8 min_top1_margin": float((top2[:, 0] - top2[:, 1]).min())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--out", default="out/float-noise.csv")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure()))
        return
    results = {}
    for name in args.configs:
        env = {**os.environ, **CONFIGS[name], "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
        print(f"== {name}", file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, __file__, "--child", "1"], env=env, cwd=ROOT, capture_output=True,
                              text=True)
        if done.returncode:
            raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    first = results[args.configs[0]]
    rows = []
    for name, got in results.items():
        for key, value in got.items():
            if key.startswith("value "):
                rows.append({"config": name, "comparison": "drift " + key.removeprefix("value "),
                             "difference": abs(value - first[key])})
            elif key not in ("threads", "capability"):
                rows.append({"config": name, "comparison": key, "difference": value})
    keys = list(dict.fromkeys(r["comparison"] for r in rows))
    print(f"{'comparison':42}" + "".join(f"{c:>22}" for c in args.configs))
    for key in keys:
        cells = {r["config"]: r["difference"] for r in rows if r["comparison"] == key}
        print(f"{key:42}" + "".join(f"{cells.get(c, float('nan')):>22.3g}" for c in args.configs))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        f.write("config,comparison,difference\n")
        f.writelines(f"{r['config']},{r['comparison']},{r['difference']:.6g}\n" for r in rows)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
