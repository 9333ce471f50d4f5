"""Measurement grids: a grid is a list of cells and a function from a cell to rows; one runner measures them.

    from codeckv.grid import Local, Ray, run_grid
    rows = run_grid(job, Path("out/ruler-smollm2-135m-samples.csv"), Local(threads=2), update=True)
    rows = run_grid(job, out, Ray(address=None, threads=1), update=True)   # the same rows, on a Ray cluster

A job (job.py) says which cells are still to measure given the rows a CSV already holds, and, in each worker process,
loads its model once and turns cells into rows. The runner (runner.py) owns what every grid command shares: resuming
from the CSV (`update`), one progress bar over the cells, writing the CSV as each cell arrives (in the grid's order,
so a serial and a cluster run write the same file), and keeping every finished row on Ctrl-C. Two backends run the
cells: in this process (local.py) or on a Ray cluster (cluster.py), each worker loading the model once.
"""

from codeckv.grid.cluster import Ray
from codeckv.grid.job import Job
from codeckv.grid.local import Local
from codeckv.grid.runner import run_grid

__all__ = ["Job", "Local", "Ray", "run_grid"]
