"""Quality at depth as grid cells (codeckv/grid/): a cell is one depth, every window prefilled once and each tier built.

    job = DepthJob("smollm2-135m", ["int8", "snapkv-50"], depths=[1024, 4096], windows=4)
    run_grid(job, Path("out/depth-smollm2-135m.csv"), Ray())     # rows: quality_row's columns per tier + node

A cell is measure/shared_quality.py's run at one depth: `windows` windows of depth + 256 tokens, the first `depth`
prefilled natively once, every tier built from that prefill and the next 256 teacher-forced; its rows are native's
and each tier's, with the spread over windows and llama.cpp's yardstick inside. A depth's rows are the same computation
wherever it runs (on one worker, all of them); `--update` adds the depths the CSV lacks and, at the depths it has, the
tiers it lacks (a kill cut them short, or the run before did not ask for them): their cell prefills native again, the
same computation as the native rows kept, so every row of a depth is against the same native run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codeckv.grid.job import Cell, CellWorker, Row, lacking

DEPTH_SCORED = 256  # tokens scored after each compressed prefix


@dataclass
class DepthJob:
    model: str
    tiers: list[str]  # preset, press+tier or tier-skipN names (get_tier); native is always measured
    depths: list[int]  # tokens prefilled per window before the scored ones
    windows: int = 4
    source: str = "corpus"  # "corpus", "docstrings" or "bible"; "text" with `text` (the rows' label)
    text: str | None = None
    pca_bits: list[float] = field(default_factory=list)  # PCA tiers at these bits per element too
    name: str = "quality at depth"
    key: tuple[str, ...] = ("prefix_tokens",)
    same: tuple[str, ...] = ("source", "text_digest", "windows")

    @property
    def text_digest(self) -> str:
        from codeckv.corpus import text_digest

        return text_digest(self.text)

    def order(self) -> list[tuple]:
        return [(str(depth),) for depth in self.depths]

    def cells(self, kept: list[Row]) -> list[Cell]:
        """Each depth the CSV lacks, with the tiers it lacks there: every one, or those a kill cut short or a run
        before did not have (measured from a native prefill of their own, the same computation as native's rows
        already kept). Rows of tiers not asked for stay."""
        names = list(dict.fromkeys(["native", *self.tiers, *(f"pca-{bits:g}b" for bits in self.pca_bits)]))
        return [{"prefix_tokens": int(depth), "tiers": missing} for (depth,), missing in lacking(self, kept, names)]

    def open(self) -> CellWorker:
        from codeckv.measure.quality import as_dicts
        from codeckv.measure.shared_quality import shared_quality
        from codeckv.measure.table import counts_text
        from codeckv.models import load_model
        from codeckv.tiers import get_tier, pca_tier

        loaded = load_model(self.model)
        tiers = {t.name: t for t in [*map(get_tier, self.tiers), *map(pca_tier, self.pca_bits)]}

        def rows(cell: Cell) -> list[Row]:
            depth, wanted = cell["prefix_tokens"], cell["tiers"]
            run = shared_quality(loaded, [tiers[name] for name in wanted if name in tiers] or [get_tier("native")],
                                 self.windows, depth + DEPTH_SCORED, depth, self.source, self.text)
            return [{**{column: counts_text(value) if isinstance(value, dict) else value
                        for column, value in row.items()}, "text_digest": self.text_digest}
                    for row in as_dicts(run.rows) if row["tier"] in wanted]

        return rows
