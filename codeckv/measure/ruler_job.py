"""The RULER grid as grid cells (codeckv/grid/): a cell is one sample, one native prefill and every tier's answer.

    job = RulerJob("qwen2.5-coder-0.5b", ["int8", "turbo-4"], tasks=["vt"], lengths=[4096], samples=8)
    run_grid(job, Path("out/ruler-qwen-samples.csv"), Ray())     # rows: RulerSampleRow's columns + node

A cell is (task, length, sample) and the tiers it still lacks: a CSV resumed with more tiers or more samples runs
only those, and a sample whose tiers are all there is not run again. Cells go length by length, task by task,
sample by sample, as the in-process ruler_grid; the rows are the same wherever a cell runs (same samples, same
answers: each tier decodes greedily in the same batch of tiers).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import asdict, dataclass

from codeckv.grid.job import Cell, CellWorker, Row, lacking
from codeckv.measure.long_tasks.haystack import DEFAULT_HAYSTACK


@dataclass
class RulerJob:
    model: str
    tiers: list[str]  # tier, peer or llama.cpp type names; native is always measured
    tasks: list[str]
    lengths: list[int]
    samples: int
    seed: int = 0
    haystack: str = DEFAULT_HAYSTACK
    press_mode: str = "once"
    name: str = "ruler"
    key: tuple[str, ...] = ("task", "length", "sample")
    same: tuple[str, ...] = ("seed", "haystack")

    def names(self) -> list[str]:
        """Every tier's name, native last (the order of a cell's rows)."""
        from codeckv.measure.peers import run_for

        return [name for name in dict.fromkeys(run_for(n).name for n in self.tiers) if name != "native"] + ["native"]

    def order(self) -> list[tuple]:
        return [(task, str(length), str(index)) for length in self.lengths for task in self.tasks
                for index in range(self.samples)]

    def cells(self, kept: list[Row]) -> list[Cell]:
        return [{"task": task, "length": int(length), "sample": int(index), "tiers": missing}
                for (task, length, index), missing in lacking(self, kept, self.names())]

    def open(self) -> CellWorker:
        from codeckv.measure.peers import run_for
        from codeckv.measure.ruler import grid_tiers, open_engines, ruler_sample
        from codeckv.models import load_model

        loaded = load_model(self.model)
        tiers = {t.name: t for t in grid_tiers(loaded, [run_for(name) for name in self.tiers], self.press_mode)}
        stack = ExitStack()  # llama.cpp's engines, open as long as the worker serves cells
        engines = open_engines(stack, list(tiers.values()), loaded.info.name, max(self.lengths))

        def rows(cell: Cell) -> list[Row]:
            todo = [tiers[name] for name in cell["tiers"]]
            return [asdict(row) for row in ruler_sample(loaded, todo, cell["task"], cell["length"], cell["sample"],
                                                        self.seed, self.haystack, self.press_mode, engines)]

        rows.engines = stack  # held by the worker with the function
        return rows
