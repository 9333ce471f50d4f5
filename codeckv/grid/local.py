"""The in-process backend: one worker in this process measures the cells in order (the serial run)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from codeckv.grid.job import Cell, Job, Row
from codeckv.grid.node import node_columns


@dataclass
class Local:
    threads: int = 0  # torch CPU threads (0: torch's own choice)

    def describe(self) -> str:
        return "in this process"

    def run(self, job: Job, cells: list[Cell]) -> Iterator[tuple[Cell, list[Row]]]:
        """(cell, rows) for each cell, in order; the model loads once, before the first."""
        if not cells:
            return
        if self.threads:
            import torch

            torch.set_num_threads(self.threads)
        worker = job.open()
        node = node_columns()
        for cell in cells:
            yield cell, [{**row, **node} for row in worker(cell)]
