"""What a grid command gives the runner: its cells, what names a cell in a row, and a worker turning cells into rows.

A job is a plain picklable object (a dataclass of names and numbers, never a loaded model): a Ray worker receives it
and opens it in its own process, loading the model once to serve many cells.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

Cell = dict  # a cell's coordinates (and what it still has to measure, e.g. the tiers a resumed sample lacks)
Row = dict
CellWorker = Callable[[Cell], list[Row]]


class Job(Protocol):
    name: str  # the command, for the progress bar and messages
    key: tuple[str, ...]  # the row columns naming the cell a row came from (every cell has them too)
    same: tuple[str, ...]  # columns every row of one CSV shares (a seed, a text): --update refuses a CSV that differs

    def cells(self, kept: list[Row]) -> list[Cell]:
        """The cells still to measure, in the grid's order, given the rows a CSV already holds (read as text)."""

    def order(self) -> list[tuple]:
        """Every cell key of the whole grid in its order: the CSV's rows are sorted by it."""

    def open(self) -> CellWorker:
        """In the worker's process: load what the cells need (the model, once) and return cell -> rows."""


def key_of(job: Job, row_or_cell: dict) -> tuple:
    """The cell a row or cell belongs to, as text (rows read back from a CSV are text)."""
    return tuple(str(row_or_cell[column]) for column in job.key)


def lacking(job: Job, kept: list[Row], names: list[str]) -> list[tuple[tuple, list[str]]]:
    """Each cell key of the grid's order whose kept rows lack some of the tier `names`, with those it lacks in their
    order: all of them for a cell not measured yet, the rest for one a kill cut short or a run of fewer tiers left."""
    have = {(key_of(job, row), row["tier"]) for row in kept}
    cells = []
    for key in job.order():
        missing = [name for name in names if (key, name) not in have]
        if missing:
            cells.append((key, missing))
    return cells
