"""The reasoning grid as grid cells (codeckv/grid/): a cell is one word problem, every tier following native.

    job = ReasoningJob("qwen2.5-coder-0.5b", ["turbo-4", "vllm-tq-k8v4"], samples=200, steps=(2, 3, 4))
    run_grid(job, Path("out/reasoning-qwen-problems.csv"), Ray())     # rows: ProblemRow's columns + node

A cell is a problem index and the tiers it still lacks; a CSV resumed with more problems or more tiers runs only
those (the torch tiers decode together, so one due reruns them all and only its rows are kept).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import asdict, dataclass

from codeckv.grid.job import Cell, CellWorker, Row, lacking


@dataclass
class ReasoningJob:
    model: str
    tiers: list[str]  # tier, peer or llama.cpp type names; native always, llama.cpp's f16 with any llama.cpp type
    samples: int
    seed: int = 0
    steps: tuple[int, ...] = (2, 3, 4)
    budget: int = 256
    name: str = "reasoning"
    key: tuple[str, ...] = ("index",)
    same: tuple[str, ...] = ("seed", "budget")

    def names(self) -> list[str]:
        """Every tier's name, in a problem's row order (torch tiers, native, then llama.cpp's f16 and types)."""
        from codeckv.measure.llamacpp import LLAMACPP_REFERENCE, LlamaCppPeer
        from codeckv.measure.peers import run_for

        tiers = [run_for(name) for name in self.tiers]
        llama = [t.name for t in tiers if isinstance(t, LlamaCppPeer)]
        torch_names = [t.name for t in tiers if not isinstance(t, LlamaCppPeer) and not t.is_native]
        llama = [LLAMACPP_REFERENCE.name] + [n for n in llama if n != LLAMACPP_REFERENCE.name] if llama else []
        return list(dict.fromkeys([*torch_names, "native", *llama]))

    def order(self) -> list[tuple]:
        return [(str(index),) for index in range(self.samples)]

    def cells(self, kept: list[Row]) -> list[Cell]:
        return [{"index": int(index), "tiers": missing} for (index,), missing in lacking(self, kept, self.names())]

    def open(self) -> CellWorker:
        from codeckv.measure.peers import run_for
        from codeckv.measure.reasoning import open_reasoning_engines, reasoning_problem, reasoning_tiers
        from codeckv.models import load_model

        loaded = load_model(self.model)
        torch_tiers, llama = reasoning_tiers(loaded, [run_for(name) for name in self.tiers])
        stack = ExitStack()  # llama.cpp's engines, open as long as the worker serves cells
        engines = open_reasoning_engines(stack, loaded, llama, self.budget)

        def rows(cell: Cell) -> list[Row]:
            return [asdict(row) for row in reasoning_problem(loaded, torch_tiers, llama, engines, cell["index"],
                                                             self.seed, tuple(self.steps), self.budget,
                                                             set(cell["tiers"]))]

        rows.engines = stack  # held by the worker with the function
        return rows
