"""The needle grid as grid cells (codeckv/grid/): a cell is one (length, depth), prefilled once, every tier answering.

    job = NeedleJob("smollm2-135m", ["turbo-4", "int8"], lengths=[1024, 4096], depths=[0.0, 0.5, 1.0])
    run_grid(job, Path("out/needle-smollm2-135m.csv"), Local())     # rows: NeedleRow's columns + node
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import asdict, dataclass

from codeckv.grid.job import Cell, CellWorker, Row


@dataclass
class NeedleJob:
    model: str
    tiers: list[str]  # tier, peer or llama.cpp type names; native always, llama.cpp's f16 with any llama.cpp type
    lengths: list[int]
    depths: list[float]
    press_mode: str = "once"
    name: str = "needle"
    key: tuple[str, ...] = ("length", "depth")
    same: tuple[str, ...] = ()

    def order(self) -> list[tuple]:
        return [(str(length), str(float(depth))) for length in self.lengths for depth in self.depths]

    def cells(self, kept: list[Row]) -> list[Cell]:
        """Every (length, depth) the CSV lacks: a cell's tiers answer from its one prefill, so it runs whole
        (--update adds lengths and depths; new tiers take a new CSV)."""
        have = {(str(row["length"]), str(float(row["depth"]))) for row in kept}
        return [{"length": int(length), "depth": float(depth)} for length, depth in self.order()
                if (length, depth) not in have]

    def open(self) -> CellWorker:
        from codeckv.measure.needle import ANSWER_TOKENS, needle_cell, needle_tiers, open_needle_engines
        from codeckv.measure.peers import run_for
        from codeckv.models import load_model

        loaded = load_model(self.model)
        torch_tiers, llama, _ = needle_tiers(loaded, [run_for(name) for name in self.tiers], self.press_mode)
        stack = ExitStack()  # llama.cpp's engines, open as long as the worker serves cells
        engines = open_needle_engines(stack, loaded, llama, max(self.lengths) + ANSWER_TOKENS)

        def rows(cell: Cell) -> list[Row]:
            return [asdict(row) for row in needle_cell(loaded, torch_tiers, llama, engines, cell["length"],
                                                       cell["depth"], self.press_mode)]

        rows.engines = stack  # held by the worker with the function
        return rows
