"""What fixes per-token quantization on outlier keys: the candidates measured for int8 and rotated-4, on two models.

    PYTHONPATH=. .venv/bin/python scripts/outlier_keys.py --out assets/outlier-keys.csv

Qwen2.5-Coder-0.5B's k_proj bias gives a few key channels values far above the others in every token. A per-token
group of channels then spends its range on them, and the other channels of the group get a coarse step: the old int8
(per-token groups of 32 on keys and values) and the old rotated-4 (keys and values rotated, then per-token 4-bit
groups) moved Qwen's predictions far more than SmolLM2's. Each candidate below stores the same bytes as the tier it
would replace; every row is the quality command's protocol (lockstep KLD, top-1 and ΔNLL against native, the same
windows for every candidate of a model and text):

    8-bit   per-token K (the old int8) | per-channel K (KIVI: one scale per channel and 32 tokens; the new int8)
            | rotated K, per-token groups (what llama.cpp's rotation does) | rotated K and V
    4-bit   rotated K per token (the old rotated-4) | per-channel K (the new rotated-4) | rotated K, then per channel
            (values rotated onto per-token 4-bit min/max groups in all three)
    DCT     jpeg-k8-int8's key coefficients in 8-bit groups of 64 per row (the old) | per channel, 4 blocks (the new)

KVQuant's dense-and-sparse split (outlier channels stored apart) is not among them: per-channel keys at the same bytes
already leave int8 at KLD ~2e-5 on Qwen, below what any split could show here.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from codeckv.cli.types import positive  # noqa: E402
from codeckv.codecs import DCT, GroupQuant, Rotation  # noqa: E402
from codeckv.corpus import SOURCES  # noqa: E402
from codeckv.measure.quality import measure_quality  # noqa: E402
from codeckv.measure.table import format_table, write_csv  # noqa: E402
from codeckv.models import load_model  # noqa: E402
from codeckv.tiers import Tier  # noqa: E402

PER_TOKEN_8, PER_CHANNEL_8 = GroupQuant(bits=8, group=32), GroupQuant(bits=8, group=32, per_channel=True)
PER_TOKEN_4, PER_CHANNEL_4 = GroupQuant(bits=4, group=32), GroupQuant(bits=4, group=32, per_channel=True)
CANDIDATES = [
    Tier("int8, K per token (old int8)", "", key=PER_TOKEN_8, value=PER_TOKEN_8),
    Tier("int8, K per channel (int8)", "", key=PER_CHANNEL_8, value=PER_TOKEN_8),
    Tier("int8, K rotated per token", "", key=Rotation(PER_TOKEN_8), value=PER_TOKEN_8),
    Tier("int8, K and V rotated", "", key=Rotation(PER_TOKEN_8), value=Rotation(PER_TOKEN_8)),
    Tier("4-bit, K rotated per token (old rotated-4)", "", key=Rotation(PER_TOKEN_4), value=Rotation(PER_TOKEN_4)),
    Tier("4-bit, K per channel (rotated-4)", "", key=PER_CHANNEL_4, value=Rotation(PER_TOKEN_4)),
    Tier("4-bit, K rotated then per channel", "", key=Rotation(PER_CHANNEL_4), value=Rotation(PER_TOKEN_4)),
    Tier("DCT, K coefficients per row (old jpeg-k8-int8)", "", key=DCT(8, 8, GroupQuant(bits=8, group=64)),
         value=DCT(8, 8, GroupQuant(bits=8, group=64))),
    Tier("DCT, K coefficients per channel (jpeg-k8-int8)", "", key=DCT(8, 8, PER_CHANNEL_8),
         value=DCT(8, 8, GroupQuant(bits=8, group=64))),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b", "smollm2-135m"])
    parser.add_argument("--sources", nargs="+", choices=list(SOURCES), default=["corpus", "bible"],
                        help="texts (default: the corpus and the Bible, prose that no tier was tuned on)")
    parser.add_argument("--windows", type=positive, default=2, help="windows of each text (default 2)")
    parser.add_argument("--length", type=positive, default=512, help="tokens per window (default 512)")
    parser.add_argument("--out", default="out/outlier-keys.csv")
    args = parser.parse_args()
    rows = []
    for model in args.models:
        loaded = load_model(model)
        for source in args.sources:
            start = time.perf_counter()
            run = measure_quality(loaded, CANDIDATES, windows=args.windows, length=args.length, source=source)
            print(f"{model}, {source}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
            rows += [{"model": model, "text": source, "candidate": r.tier, "stores_vs_bf16": f"{r.ratio_vs_bf16:.4f}",
                      "kld": f"{r.kld:.6f}", "kld_se": f"{r.kld_se:.6f}", "top1_pct": f"{r.top1_pct:.2f}",
                      "delta_nll_pct": f"{r.delta_nll_pct:+.3f}"} for r in run.rows if r.tier != "native"]
    print(format_table(rows, list(rows[0])))
    print(f"{args.windows} windows x {args.length} tokens per text, lockstep against native (the quality protocol)")
    print(f"wrote {write_csv(rows, args.out)}")


if __name__ == "__main__":
    main()
