"""The README's and docs/quality.md's tables, written from the committed quality CSVs (no figure typed by hand).

    .venv/bin/python scripts/quality_table.py                   # the headline table: both models, every text
    .venv/bin/python scripts/quality_table.py --full corpus     # one text's whole table (ΔNLL, Δp, the tails)
    .venv/bin/python scripts/quality_table.py --full bible --model qwen2.5-coder-0.5b
    .venv/bin/python scripts/quality_table.py --ratio       # Qwen's KLD over SmolLM2's, per tier and text
    .venv/bin/python scripts/quality_table.py --ppl --tiers vllm-tq-k8v4 ...   # perplexity change, per text
    .venv/bin/python scripts/quality_table.py --tiers int8 turbo-4 fp8-e4m3   # the headline's rows of these only
    .venv/bin/python scripts/quality_table.py --presses -presses-4k --tiers snapkv-50 ...   # presses on 4k contexts

Reads assets/quality-<model>[-<source>].csv (written by `python -m codeckv quality [--source S] --out ...`) and the
presses' rows beside it, assets/quality-<model>[-<source>]-presses.csv (1,024-token contexts pressed once: marked ‡),
and prints Markdown. Rows keep the order of the corpus CSVs; a source whose CSV is missing is left out. "stores" is
what each cache keeps per token seen in its own format, bf16 for raw tokens (codeckv.measure.quality.stored_vs_bf16):
a press at the share it keeps, native at 100%.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from codeckv.measure.quality import stored_vs_bf16  # noqa: E402

SOURCES = {"corpus": "", "docstrings": "-docstrings", "bible": "-bible"}
SHORT = {"smollm2-135m": "SmolLM2", "qwen2.5-coder-0.5b": "Qwen", "gemma3-270m": "Gemma 3"}  # column headers


PRESSES = "-presses"  # the presses' CSVs: assets/quality-<model>[-<source>]<suffix>.csv (--presses)


def _rows(model: str, source: str, presses: str = PRESSES) -> dict[str, dict]:
    """The text's rows of both CSVs, the presses' (all but their native, from the file `presses` names) after the
    others."""
    rows = {}
    for suffix in ("", presses):
        path = ROOT / "assets" / f"quality-{model}{SOURCES[source]}{suffix}.csv"
        if path.exists():
            rows |= {row["tier"]: row for row in csv.DictReader(path.open())
                     if not (suffix and row["tier"] == "native")}
    return rows


def _num(row: dict, key: str) -> float:
    value = row.get(key, "")
    return float(value) if value not in ("", None) else math.nan


def _kld(value: float) -> str:
    if value == 0:
        return "0"
    return f"{value:.6f}" if value < 0.001 else f"{value:.4f}" if value < 0.1 else f"{value:.3f}"


def _name(row: dict) -> str:
    marks = ("" if row.get("reference", "native") == "native" else " †") + (" ‡" if row.get("press_mode") else "")
    return f"`{row['tier']}`" + marks


def headline(models: list[str], tiers: list[str] | None = None, presses: str = PRESSES) -> str:
    """Every row of the models' corpus CSVs (the first model's order), or those of `tiers` in their order, what it
    stores (per model where the models differ: a tier whose boundary layers stay native), and per model its KLD on
    each text and its top-1 on the Bible (the text furthest from every calibration)."""
    texts = {m: {s: rows for s in SOURCES if (rows := _rows(m, s, presses))} for m in models}
    order = list(dict.fromkeys(tier for m in models for rows in texts[m].values() for tier in rows))
    order = order if tiers is None else [tier for tier in tiers if tier in order]  # in the order given
    head = ["cache", "stores (vs bf16)"]
    for model in models:
        name = SHORT.get(model, model)
        head += [f"{name} KLD {source}" for source in texts[model]] + [f"{name} top-1 bible"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for tier in order:
        first = next(rows[tier] for m in models for rows in texts[m].values() if tier in rows)
        stored = dict.fromkeys(f"{100 * stored_vs_bf16(rows[tier]):.1f}%" for m in models
                               for rows in list(texts[m].values())[:1] if tier in rows)  # per model, where it differs
        cells = [_name(first), " / ".join(stored)]
        for model in models:
            for rows in texts[model].values():
                cells.append(_kld(_num(rows[tier], "kld")) if tier in rows else "")
            bible = texts[model].get("bible", {}).get(tier)
            cells.append(f"{_num(bible, 'top1_pct'):.1f}%" if bible else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def full(model: str, source: str, presses: str = PRESSES, tiers: list[str] | None = None) -> str:
    """One text's whole table (every row, or those of `tiers`)."""
    rows = {tier: row for tier, row in _rows(model, source, presses).items() if tiers is None or tier in tiers}
    head = ["cache", "vs bf16", "KLD ± se", "KLD 99.9%", "KLD max", "top-1 % ± se", "ΔNLL % ± se", "RMS Δp"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for row in rows.values():
        lines.append("| " + " | ".join([
            _name(row), f"{100 * stored_vs_bf16(row):.1f}%",
            f"{_kld(_num(row, 'kld'))} ± {_kld(_num(row, 'kld_se'))}", _kld(_num(row, "kld_p999")),
            _kld(_num(row, "kld_max")), f"{_num(row, 'top1_pct'):.1f} ± {_num(row, 'top1_se'):.1f}",
            f"{_num(row, 'delta_nll_pct'):+.2f} ± {_num(row, 'delta_nll_se'):.2f}",
            f"{100 * _num(row, 'dp_rms'):.2f}%",
        ]) + " |")
    return "\n".join(lines)


def perplexity(models: list[str], tiers: list[str] | None = None) -> str:
    """Each tier's perplexity change on every text, 100 (exp(NLL_tier - NLL_native) - 1) % ± its standard error (the
    ΔNLL's, in nats, through the same exponential): the figure vLLM's TurboQuant config quotes. A row scored against
    another reference (llama.cpp's, against its f16) is measured from that reference's NLL (its ΔNLL's)."""
    texts = {m: {s: rows for s in SOURCES if (rows := _rows(m, s))} for m in models}
    head = ["cache", *(f"{SHORT.get(m, m)} ΔPPL {s}" for m in models for s in texts[m])]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    order = [t for t in dict.fromkeys(t for m in models for r in texts[m].values() for t in r) if t != "native"]
    for tier in (t for t in order if tiers is None or t in tiers):
        cells = [f"`{tier}`"]
        for model in models:
            for rows in texts[model].values():
                if tier not in rows:
                    cells.append("")
                    continue
                share = _num(rows[tier], "delta_nll_pct") / 100  # of the reference's NLL (llama.cpp's: its f16)
                base = _num(rows[tier], "nll") / (1 + share)
                delta = base * share
                spread = math.exp(delta) * _num(rows[tier], "delta_nll_se") * base / 100
                cells.append(f"{100 * math.expm1(delta):+.2f} ± {100 * spread:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratios(models: list[str]) -> str:
    """The second model's KLD over the first's, per tier and text: does a tier hold on the other model?"""
    first, second = models[:2]
    head = ["cache", *(f"{SHORT.get(first, first)} KLD {s}" for s in SOURCES), *(f"× on {s}" for s in SOURCES)]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    a, b = ({s: _rows(m, s) for s in SOURCES} for m in (first, second))
    for tier in a["corpus"]:
        if tier == "native" or not all(tier in b[s] and tier in a[s] for s in SOURCES):
            continue
        klds = [_num(a[s][tier], "kld") for s in SOURCES]
        times = [_num(b[s][tier], "kld") / k if k > 0 else math.nan for s, k in zip(SOURCES, klds)]
        lines.append("| " + " | ".join([_name(a["corpus"][tier]), *map(_kld, klds),
                                        *(f"{t:.2f}×" if t == t else "" for t in times)]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", default=["smollm2-135m", "qwen2.5-coder-0.5b"],
                        help="models (the headline: each beside the others; --full: the first)")
    parser.add_argument("--full", choices=list(SOURCES), help="one text's whole table instead of the headline")
    parser.add_argument("--ratio", action="store_true", help="the second model's KLD over the first's, per text")
    parser.add_argument("--tiers", nargs="+", help="the rows of these caches only (headline, --full, --ppl)")
    parser.add_argument("--ppl", action="store_true", help="each tier's perplexity change on every text")
    parser.add_argument("--presses", default=PRESSES,
                        help="suffix of the presses' CSVs (default -presses: 1,024-token contexts; -presses-4k: 4,096)")
    args = parser.parse_args()
    if args.ratio:
        print(ratios(args.model))
    elif args.ppl:
        print(perplexity(args.model, args.tiers))
    else:
        print(full(args.model[0], args.full, args.presses, args.tiers) if args.full
              else headline(args.model, args.tiers, args.presses))


if __name__ == "__main__":
    main()
