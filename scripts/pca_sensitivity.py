"""Why a PCA tier's KLD differs between texts: the error its coder leaves, and what that error costs on each text.

    PYTHONPATH=. .venv/bin/python scripts/pca_sensitivity.py --tier pca-8x

On the windows the quality command reads (4 x 513 tokens of each text), every full-attention layer's keys (RoPE
removed) and values x of each token are coded at the tier's calibrated step (codecs/pca.py; the rate control's
per-chunk rung is left out) and decoded to x^. Per token, summed over layers, it prints:

    whitened error   ||y - y^||^2, y the whitened components: what the coder controls (one step for all)
    loss error       (g . (x^ - x))^2, g the gradient of the window's summed next-token NLL w.r.t. x on this
                     text: the error weighted by this text's own Fisher information, E[g g^T], to which the
                     loss increase is proportional
    ratio            loss error / whitened error: 1 where the text is as sensitive as the calibration text
                     (the basis is whitened by the calibration's Fisher), more where each unit of error costs more

and the range of the ratio over layers. A ratio far above 1 on a text means the same coder, at the same bits,
moves the loss there that much more: a property of the model on that text, which no choice of step changes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from codeckv.cache.calibration import calibration_for  # noqa: E402
from codeckv.cache.calibration_fit import capture_gradients  # noqa: E402
from codeckv.cli.types import positive  # noqa: E402
from codeckv.codecs.pca import ecsq  # noqa: E402
from codeckv.corpus import SOURCES, text_windows  # noqa: E402
from codeckv.measure.table import format_table  # noqa: E402
from codeckv.models import load_model  # noqa: E402
from codeckv.tiers import get_tier  # noqa: E402


def errors(loaded, coders: dict, ids: torch.Tensor) -> dict[int, tuple[float, float, int]]:
    """Per layer: (summed whitened error, summed loss error, rows) over the windows `ids`."""
    sums: dict[int, list] = {}

    def accumulate(index: int, x: torch.Tensor, g: torch.Tensor) -> None:
        coder = coders[index]
        y = (x - coder.mean) @ coder.enc
        coded = ecsq(y, coder.step).float() * coder.step  # the codes' values at the calibrated step
        error = coded @ coder.dec + coder.mean - x
        row = sums.setdefault(index, [0.0, 0.0, 0])
        row[0] += float((y - coded).pow(2).sum())
        row[1] += float((g * error).sum(1).pow(2).sum())
        row[2] += x.shape[0]

    with torch.inference_mode(False):
        capture_gradients(loaded.model, ids, accumulate)
    return {index: tuple(row) for index, row in sums.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tier", default="pca-8x", help="a PCA tier (default pca-8x)")
    parser.add_argument("--windows", type=positive, default=4, help="windows of each text (default 4)")
    parser.add_argument("--length", type=positive, default=512, help="tokens per window (default 512)")
    args = parser.parse_args()
    tier = get_tier(args.tier)
    if tier.joint is None:
        raise SystemExit(f"tier '{tier.name}' is not a PCA tier")
    loaded = load_model()
    coders = calibration_for(loaded, tier).coders
    rows = []
    for source, text in SOURCES.items():
        ids = text_windows(loaded.tokenizer, text(), args.windows, args.length + 1, f"the {source}")
        per_layer = errors(loaded, coders, ids)
        tokens = next(iter(per_layer.values()))[2]
        whitened = sum(w for w, _, _ in per_layer.values()) / tokens
        loss = sum(v for _, v, _ in per_layer.values()) / tokens
        ratios = [v / w for w, v, _ in per_layer.values()]
        rows.append({"text": source, "tokens": tokens, "whitened_error": f"{whitened:.4g}", "loss_error": f"{loss:.4g}",
                     "ratio": f"{loss / whitened:.2f}", "ratio_per_layer": f"{min(ratios):.2f}-{max(ratios):.2f}"})
    print(format_table(rows, list(rows[0])))
    print(f"{tier.name}, {args.windows} windows x {args.length + 1} tokens of each text (the sink positions left out)")


if __name__ == "__main__":
    main()
