"""Quality over windows as grid cells (codeckv/grid/): a cell is one window, native and every tier fed it in lockstep.

    job = WindowJob("smollm2-135m", ["int8", "turbo-4"], windows=8, length=512)
    rows = run_grid(job, Path("out/quality-smollm2-135m-windows.csv"), Ray())   # a row per window and tier
    run = job.combine(rows, job.reference_windows(tokenizer), tokenizer)    # what `quality` tabulates and charts

A cell is measure_quality's run on one of the consecutive windows (its `window`), so a cluster measures windows side
by side. Its rows are that run's rows (bytes, this window's KLD, top-1 and NLL) with the window's per-position NLL,
KLD and top-1 beside them (float32 and uint8, base64: read back bit for bit). combine stacks those into the
(windows, positions) scores a serial run holds and computes the table's means, their standard errors over windows
and llama.cpp's yardstick, whose percentiles pool every position of every window, with the serial run's own
functions (lockstep.compare, yardstick.yardstick): the rows are the same wherever each window ran. A peer that cannot
run gets a row saying why (`absent`) instead of numbers. A window cut short by a kill measures the tiers it lacks
against a native run of its own; a CSV measured with other tiers, text, windows or protocol is refused.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

import numpy as np
import torch

from codeckv.corpus import text_digest
from codeckv.grid.job import Cell, CellWorker, Row, lacking

POSITION_COLUMNS = {"nll_positions": "<f4", "kld_positions": "<f4", "top1_positions": "u1"}


def encoded(values: torch.Tensor, dtype: str) -> str:
    """A (positions,) tensor as base64 of its `dtype` bytes (exact for float32)."""
    return base64.b64encode(np.ascontiguousarray(values.numpy().astype(dtype)).tobytes()).decode("ascii")


def decoded(text: str, dtype: str) -> torch.Tensor:
    """encoded's tensor back (float32, or bool for uint8)."""
    values = torch.from_numpy(np.frombuffer(base64.b64decode(text), dtype=dtype).copy())
    return values.bool() if dtype == "u1" else values


@dataclass
class WindowJob:
    model: str
    tiers: list[str]  # tier, peer or llama.cpp type names (run_for); native always, llama.cpp's f16 with its types
    windows: int = 4
    length: int = 512
    prefix: int = 256  # tokens prefilled per window before the scored ones
    source: str = "corpus"  # "corpus", "docstrings" or "bible"; "text" with `text` (the rows' label)
    text: str | None = None
    press_mode: str = "once"
    pca_bits: list[float] = field(default_factory=list)  # PCA tiers at these bits per element too
    name: str = "quality"
    key: tuple[str, ...] = ("window",)
    same: tuple[str, ...] = ("source", "text_digest", "windows", "tokens_per_window", "prefix_tokens",
                             "press_protocol", "run_tiers")

    def __post_init__(self) -> None:
        if not 1 <= self.prefix <= self.length - 1:
            raise ValueError(f"--prefix {self.prefix} must leave scored tokens in a window of {self.length} "
                             f"(allowed: 1..{self.length - 1})")

    @property
    def text_digest(self) -> str:
        return text_digest(self.text)

    @property
    def tokens_per_window(self) -> int:
        return self.length

    @property
    def prefix_tokens(self) -> int:
        return self.prefix

    @property
    def press_protocol(self) -> str:
        return self.press_mode

    @property
    def run_tiers(self) -> str:
        return " ".join(self.names())

    def names(self) -> list[str]:
        """Every row's tier name in a window, in a serial run's order: native, the tiers and peers, the PCA
        frontier's, then llama.cpp's f16 and its types."""
        from codeckv.measure.llamacpp import LLAMACPP_REFERENCE, LlamaCppPeer
        from codeckv.measure.peers import run_for

        runs = [run_for(name) for name in self.tiers]
        llama = [t.name for t in runs if isinstance(t, LlamaCppPeer)]
        return list(dict.fromkeys(["native", *(t.name for t in runs if not isinstance(t, LlamaCppPeer)),
                                   *(f"pca-{b:g}b" for b in self.pca_bits),
                                   *([LLAMACPP_REFERENCE.name, *llama] if llama else [])]))

    def order(self) -> list[tuple]:
        return [(str(window),) for window in range(self.windows)]

    def cells(self, kept: list[Row]) -> list[Cell]:
        """Each window the CSV lacks, with the tiers it lacks (every one unless a kill cut its rows short)."""
        return [{"window": int(window), "tiers": missing} for (window,), missing in lacking(self, kept, self.names())]

    def open(self) -> CellWorker:
        from codeckv.measure.peers import run_for
        from codeckv.measure.quality import as_dicts, measure_quality
        from codeckv.measure.table import counts_text
        from codeckv.models import load_model
        from codeckv.tiers import pca_tier

        loaded = load_model(self.model)
        runs = {t.name: t for t in [*(run_for(name) for name in self.tiers), *map(pca_tier, self.pca_bits)]}
        same = {column: getattr(self, column) for column in self.same}

        def rows(cell: Cell) -> list[Row]:
            wanted = cell["tiers"]
            asked = [runs.get(name) or run_for(name) for name in wanted]  # llama.cpp's f16 alone, too
            run = measure_quality(loaded, asked, self.windows, self.length, self.source, self.text,
                                  prefix=self.prefix, press_mode=self.press_mode, window=cell["window"])
            scores = {**run.scores, **(run.llamacpp.scores if run.llamacpp else {})}
            out = []
            for row in as_dicts(run.rows):
                if row["tier"] not in wanted:
                    continue
                positions = scores[row["tier"]]
                out.append({**{column: counts_text(value) if isinstance(value, dict) else value
                               for column, value in row.items()}, **same, "window": cell["window"], "absent": "",
                            **{column: encoded(getattr(positions, column.split("_")[0])[0], dtype)
                               for column, dtype in POSITION_COLUMNS.items()}})
            for reason in run.absent:
                tier = reason.split(":", 1)[0]
                if tier in wanted:
                    out.append({"tier": tier, **same, "window": cell["window"], "absent": reason})
            return out

        return rows

    def reference_windows(self, tokenizer) -> torch.Tensor:
        """The (windows, length + 1) token ids the cells read (a ValueError if the text is too short for them)."""
        from codeckv.corpus import source_text, text_windows

        where = "the text" if self.text is not None else f"the {self.source}"
        return text_windows(tokenizer, self.text if self.text is not None else source_text(self.source),
                            self.windows, self.length + 1, where)

    def combine(self, rows: list[Row], windows: torch.Tensor, tokenizer):
        """Every window's rows (read back as text) and the windows' ids (reference_windows) -> the QualityRun a serial
        run over the same windows gives: a row per tier with its means, spread and yardstick over all windows
        (module docstring)."""
        from codeckv.measure.llamacpp import LLAMACPP_REFERENCE
        from codeckv.measure.lockstep import Reference, Scores
        from codeckv.measure.quality import LLAMACPP_REFERENCE_LABEL, QualityRun, combined_row

        by_tier: dict[str, dict[int, Row]] = {}
        absent: dict[str, str] = {}
        for row in rows:
            if row.get("absent"):
                absent[row["tier"]] = row["absent"]
            else:
                by_tier.setdefault(row["tier"], {})[int(row["window"])] = row
        scores = {tier: Scores(*(torch.stack([decoded(cells[w][column], dtype) for w in range(self.windows)])
                                 for column, dtype in POSITION_COLUMNS.items()))
                  for tier, cells in by_tier.items()}
        references = {"native": "native", LLAMACPP_REFERENCE_LABEL: LLAMACPP_REFERENCE.name}
        reference = {label: Reference(windows, self.prefix, torch.empty(0), scores[tier].nll)
                     for label, tier in references.items() if tier in scores}  # logprobs: no table reads them
        names = self.names()
        order = sorted(by_tier, key=lambda tier: names.index(tier) if tier in names else len(names))
        table = [combined_row([by_tier[tier][w] for w in range(self.windows)], reference, scores[tier])
                 for tier in order]
        tokens = [tokenizer.decode([t]) for t in reference["native"].targets[0].tolist()]
        llama_labels = {row.tier for row in table if row.reference == LLAMACPP_REFERENCE_LABEL}
        return QualityRun(table, reference["native"], {t: s for t, s in scores.items() if t not in llama_labels},
                          tokens, list(absent.values()))
