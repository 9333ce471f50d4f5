"""The one grid runner: resume, progress, stop and CSV writing, whichever backend measures the cells.

    rows = run_grid(job, out, Local(threads=2), update=True)

With `update`, the rows already in the CSV at `out` are kept (refused if they differ from the job in a column of
`job.same`) and only the cells they lack are measured; without it the CSV is written anew. Each cell's rows are
appended to the file as the cell arrives (a write of its own rows only, so the driver keeps up with a cluster's
many workers: rewriting 214,500 rows takes 1.3 s here), and when the grid ends the file is rewritten once, sorted
in the grid's order (cells the grid no longer has first): a run on a cluster writes the same file as a serial
run. One progress bar counts cells. Ctrl-C stops the backend (a cluster's workers too) and keeps every row
appended; `update` resumes, wherever the rows stand in the file.
"""

from __future__ import annotations

import csv
import os
import sys
from contextlib import closing
from pathlib import Path

from tqdm import tqdm

from codeckv.grid.job import Job, Row, key_of


def read_rows(path: Path) -> list[Row]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def write_rows(rows: list[Row], path: Path) -> None:
    """The CSV with every row's columns (a column missing from a row is left empty), replaced atomically: a kill
    mid-write leaves the previous file."""
    columns = list(dict.fromkeys(column for row in rows for column in row))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    with partial.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)
    partial.replace(path)


def append_rows(rows: list[Row], path: Path) -> None:
    """Add rows to the CSV at `path` (its header first if it has none yet). Rows with a column the header lacks
    rewrite the file with every column."""
    columns = list(dict.fromkeys(column for row in rows for column in row))
    if path.exists() and path.stat().st_size:
        with path.open(newline="") as f:
            header = next(csv.reader(f), [])
        if not set(columns) <= set(header):
            write_rows(read_rows(path) + rows, path)
            return
        columns = header
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            csv.DictWriter(f, fieldnames=columns).writeheader()
    with path.open("a", newline="") as f:
        csv.DictWriter(f, fieldnames=columns, restval="").writerows(rows)


def drop_partial_line(path: Path) -> None:
    """Cut a last line a killed run left half-written (the file does not end with a newline): its cell then lacks
    that row and is measured again for it."""
    with path.open("rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        f.seek(max(0, size - 2**20))
        tail = f.read()
        f.truncate(size - len(tail) + tail.rfind(b"\n") + 1)


def kept_rows(job: Job, out: Path, update: bool) -> list[Row]:
    """The rows --update keeps from `out` (none without it, or without the file)."""
    if not (update and out.exists()):
        return []
    drop_partial_line(out)
    kept = read_rows(out)
    for row in kept:
        for column in job.same:  # a CSV written before a column existed is not refused for lacking it
            if column in row and str(row[column]) != str(getattr(job, column)):
                raise ValueError(f"{out} was measured with {column} {row.get(column)}, not {getattr(job, column)}: "
                                 "update a CSV measured the same way, or write a new one")
    return kept


def run_grid(job: Job, out: Path, backend, update: bool = False) -> list[Row]:
    """Measure the cells `out` lacks on `backend` (Local or Ray); every row of the CSV afterwards (kept ones too)."""
    kept = kept_rows(job, out, update)
    todo = job.cells(kept)
    place = {key: index for index, key in enumerate(job.order())}
    rows, arrived, fresh = list(kept), set(), not update
    total = len(place)
    bar = tqdm(total=total, initial=total - len({key_of(job, cell) for cell in todo}), desc=job.name, unit="cell")
    bar.set_postfix_str(backend.describe(), refresh=False)
    try:
        with closing(backend.run(job, todo)) as results:
            for cell, cell_rows in results:
                key = key_of(job, cell)
                if key in arrived:  # a cell's rows are written once, whatever a backend did to get them
                    continue
                arrived.add(key)
                rows += cell_rows
                if fresh:  # without update the file holds what this run measures, from its first cell on
                    out.unlink(missing_ok=True)
                    fresh = False
                append_rows(cell_rows, out)
                bar.set_postfix_str(f"{', '.join(map(str, key))} on {cell_rows[0]['node'] if cell_rows else '-'}")
                bar.update(1)
    except KeyboardInterrupt:
        bar.close()
        print(f"interrupted: {out} holds the {len(rows)} rows done; --update resumes", file=sys.stderr)
        raise
    finally:  # before any error is printed: the bar's last line never follows it
        bar.close()
    ordered = sorted(rows, key=lambda row: place.get(key_of(job, row), -1))  # stable: a cell's rows keep their order
    if arrived or ordered != rows:  # an interrupted run's appended rows are sorted by the run that finishes the grid
        write_rows(ordered, out)
    return ordered
