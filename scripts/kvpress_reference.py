"""Record what NVIDIA kvpress's own presses keep, as the fixture tests/presses/test_kvpress_reference.py checks against.

    .venv/bin/python scripts/kvpress_reference.py                                   # SmolLM2-135M, every ratio
    .venv/bin/python scripts/kvpress_reference.py --model qwen2.5-coder-0.5b --ratios 0.5 0.75
    .venv/bin/python scripts/kvpress_reference.py --check [--model M]     # codeckv beside the fixture: a table
    .venv/bin/python scripts/kvpress_reference.py --decoding [--check]    # the decoding presses: <model>-decoding.json

kvpress pins transformers below 5.3 and this project transformers 5.24, so kvpress runs in a virtualenv of its own
($CODECKV_CACHE/kvpress-<version>-venv, built here once from the package registry: torch as this project pins it,
transformers 5.2, kvpress --no-deps with the packages it imports). This script, in the project's environment, loads
the embedded model (its converted safetensors copy is what the other side loads, so both run the same fp32 weights)
and tokenizes the text; scripts/kvpress_worker.py, in kvpress's environment, prefills the context once with each
press (kvpress's protocol), records the positions each layer and KV head kept, and teacher-forces the next tokens
one at a time (KLD and top-1 against its native cache). The fixture is assets/kvpress-reference/<model>.json.
--decoding records kvpress's DecodingPress / CompressionRatioDecodingPress for codeckv's decoding tiers instead
(scripts/kvpress_decoding_worker.py; codeckv/measure/kvpress_decoding_check.py): <model>-decoding.json.

When kvpress releases: pass --kvpress NEW_VERSION (and --transformers if it pins another), run it for both models,
run the test, and commit the fixtures with the versions they record.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from codeckv.measure.kvpress_check import (  # noqa: E402
    CONTEXT,
    DECODED,
    FIXTURES,
    REFERENCE_PRESSES,
    reference_text,
)
from codeckv.measure.kvpress_decoding_check import CONTEXT as DECODING_CONTEXT  # noqa: E402
from codeckv.measure.kvpress_decoding_check import DECODING_TIERS, kvpress_spec  # noqa: E402
from codeckv.measure.kvpress_decoding_check import STEPS as DECODING_STEPS  # noqa: E402
from codeckv.models import load_model  # noqa: E402
from codeckv.paths import cache_dir  # noqa: E402
from codeckv.presses import RATIOS  # noqa: E402
from scripts.reference_venv import reference_venv  # noqa: E402

KVPRESS_DEPS = ["accelerate<2,>=1.0.0", "cachetools<6,>=5.5.2", "datasets>=2.21.0", "fire<0.7,>=0.6.0",
                "numpy<3,>=2.0.0", "pandas<3,>=2.2.2", "peft>=0.20.0", "requests<3,>=2.32.3", "safetensors"]


def kvpress_venv(kvpress: str, transformers: str, torch: str) -> Path:
    """The python of a virtualenv holding kvpress==kvpress beside transformers==transformers (built once)."""
    return reference_venv(f"kvpress-{kvpress}", [[f"torch=={torch}", f"transformers=={transformers}", *KVPRESS_DEPS],
                                                 ["--no-deps", f"kvpress=={kvpress}"]])


def print_check(model: str, fixture: Path) -> None:
    """codeckv's presses on the fixture's tokens beside kvpress's record, as a Markdown table."""
    from codeckv.measure.kvpress_check import check_presses, load_reference

    start = time.perf_counter()
    reference = load_reference(fixture)
    rows = check_presses(load_model(model), reference)
    print(f"| press | evicted | kept positions shared (Jaccard: mean, worst layer) | KLD codeckv | KLD kvpress "
          f"{reference['kvpress']} | top-1 codeckv / kvpress |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r.press} | {r.ratio:.1%} | {r.jaccard_mean:.4f}, {r.jaccard_min:.4f} | {r.kld:.4f} | "
              f"{r.kld_kvpress:.4f} | {r.top1_pct:.1f}% / {r.top1_pct_kvpress:.1f}% |")
    print(f"{model}, {reference.get('text', 'GPL-3')}: {reference['context']}-token context pressed once, "
          f"{reference['decoded']} tokens teacher-forced; "
          f"took {time.perf_counter() - start:.0f} s")


def print_decoding_check(model: str, fixture: Path) -> None:
    """codeckv's decoding tiers on the fixture's tokens beside kvpress's record, as a Markdown table."""
    from codeckv.measure.kvpress_check import load_reference
    from codeckv.measure.kvpress_decoding_check import check_decoding

    start = time.perf_counter()
    reference = load_reference(fixture)
    print(f"| tier | compressions | held (ours / kvpress) | Jaccard (mean, worst layer) | KLD codeckv | KLD kvpress "
          f"{reference['kvpress']} | top-1 codeckv / kvpress |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in check_decoding(load_model(model), reference):
        print(f"| {r.tier} | {r.compressions} | {r.held} / {r.held_kvpress} | "
              f"{sum(r.jaccard) / len(r.jaccard):.4f}, {r.jaccard_min:.4f} | {r.kld:.4f} | {r.kld_kvpress:.4f} | "
              f"{r.top1_pct:.1f}% / {r.top1_pct_kvpress:.1f}% |")
    print(f"{model}, {reference['text']}: {reference['context']}-token context prefilled, {reference['decoded']} "
          f"tokens decoded one at a time; took {time.perf_counter() - start:.0f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--ratios", type=float, nargs="+", default=list(RATIOS))
    parser.add_argument("--presses", nargs="+", default=list(REFERENCE_PRESSES), choices=list(REFERENCE_PRESSES))
    parser.add_argument("--text", default="GPL-3", help="a licence of /usr/share/common-licenses (default GPL-3; "
                        "another is written to <model>-<text>.json)")
    parser.add_argument("--kvpress", default="0.5.5")
    parser.add_argument("--transformers", default="5.2.0")
    parser.add_argument("--out", type=Path, help="default: assets/kvpress-reference/<model>.json")
    parser.add_argument("--decoding", action="store_true",
                        help="the decoding presses (tova-decoding256, ...): kvpress's DecodingPress, "
                             "<model>-decoding.json")
    parser.add_argument("--check", action="store_true",
                        help="record nothing: print codeckv's presses beside the committed fixture (Markdown)")
    args = parser.parse_args(argv)
    named = f"{args.model}.json" if args.text == "GPL-3" else f"{args.model}-{args.text}.json"
    fixture = args.out or FIXTURES / (named.replace(".json", "-decoding.json") if args.decoding else named)
    if args.check:
        (print_decoding_check if args.decoding else print_check)(args.model, fixture)
        return

    import torch

    loaded = load_model(args.model)  # converts once and keeps the safetensors copy the worker loads
    weights = cache_dir() / args.model
    if not (weights / "model.safetensors").exists():
        raise SystemExit(f"no converted copy of {args.model} at {weights} (an embedded model converts on first load)")
    context, decoded = (DECODING_CONTEXT, DECODING_STEPS) if args.decoding else (CONTEXT, DECODED)
    ids = loaded.tokenizer(reference_text(args.text), return_tensors="pt").input_ids[0, : context + decoded + 1]
    ids = ids.tolist()
    presses = ({name: kvpress_spec(name) for name in DECODING_TIERS} if args.decoding
               else {name: REFERENCE_PRESSES[name] for name in args.presses})
    worker = "kvpress_decoding_worker.py" if args.decoding else "kvpress_worker.py"
    python = kvpress_venv(args.kvpress, args.transformers, torch.__version__.split("+")[0])
    out = fixture
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"model_dir": str(weights), "model": args.model, "text": args.text, "ids": ids,
                                   "context": context, "presses": presses, "ratios": args.ratios}))
        start = time.perf_counter()
        subprocess.run([str(python), str(REPO / "scripts" / worker), str(job), str(out)], check=True)
    print(f"wrote {out} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
