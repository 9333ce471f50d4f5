"""The Ray backend: the cells spread over a Ray cluster's workers, each loading the model once to serve many cells.

    Ray()                  # a cluster started on this machine for this run, listening on the loopback address only
    Ray("auto")            # join the cluster this node belongs to (`ray start` ran here); or "host:port", $RAY_ADDRESS

One worker (a Ray actor) per `threads` CPUs of the cluster, or one per GPU where the cluster has GPUs (the model then
loads on that GPU and the kernels take the Triton path). Each worker holds one cell at a time, so a fast node takes
more cells than a slow one. A worker whose process dies is restarted by Ray (the model loaded again) and the cell it
held is run again there: no cell is lost, and each cell's rows reach the driver once. A worker only unreachable for
a while (its node stalled) is sent its cell again, up to RESTARTS times. An exception inside a cell stops the grid
with that exception; what arrived before it is kept (runner.py). Ctrl-C stops the driver within WAIT_SECONDS and
kills the workers.

Ray is an optional extra (`pip install 'codeckv[cluster]'`); it is imported only here, when a grid runs on it.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from codeckv.grid.job import Cell, Job, Row
from codeckv.grid.node import node_columns

RAY_PIN = "ray==2.60.0"  # pyproject's cluster extra and requirements-cluster.txt
RESTARTS = 3  # times a worker's process may die (each time the cell it held is run again) before the grid stops
CONNECT_SECONDS = 5.0  # how long --ray host:port may take to answer before the grid is refused
WAIT_SECONDS = 1.0  # the driver waits for a cell this long at a time, so Ctrl-C stops it within a second
OBJECT_STORE_BYTES = 256 * 2**20  # a local cluster's shared store: cells and rows are small (the default is 30% of RAM)


def import_ray(local: bool):
    """The ray module, quiet (no usage report, no auth token under ~) and, for a cluster started here, bound to the
    loopback address; a RuntimeError saying how to install it when absent."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    imported = sys.modules.get("ray") is not None
    if local and imported and os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") != "0":
        print("warning: ray was imported before codeckv could bind a local cluster to 127.0.0.1; one started now "
              "listens on this machine's network address too", file=sys.stderr)
    if local and not imported:
        # Ray's switch for a single-machine cluster: every node address is 127.0.0.1, so its servers listen there
        # only (read once, when ray is imported; the workers inherit it)
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        # and its workers at the priority of a serial run (Ray's default nices them: beside other work on the
        # machine, their seconds would then not compare with a serial run's)
        os.environ.setdefault("RAY_worker_niceness", "0")
    try:
        import ray
    except ImportError:
        raise RuntimeError(f"--ray needs Ray, which is not installed: pip install 'codeckv[cluster]' "
                           f"(or pip install {RAY_PIN})") from None
    return ray


class GridWorker:
    """One Ray actor: the job opened once in its process (the model loaded), then a cell at a time."""

    def __init__(self, job: Job, threads: int):
        import ray
        import torch

        torch.set_num_threads(threads)
        self.cell_rows = job.open()
        self.node = node_columns(ray.get_runtime_context().get_node_id())

    def run(self, cell: Cell) -> tuple[Cell, list[Row]]:
        return cell, [{**row, **self.node} for row in self.cell_rows(cell)]


@dataclass
class Ray:
    address: str | None = None  # None: $RAY_ADDRESS if set, else a cluster started here for the run
    threads: int = 1  # torch threads per worker, and the CPUs each worker reserves

    def describe(self) -> str:
        where = self.address or os.environ.get("RAY_ADDRESS") or "a local cluster"
        return f"on Ray ({where}), {self.threads} thread{'s' * (self.threads > 1)} a worker"

    def run(self, job: Job, cells: list[Cell]) -> Iterator[tuple[Cell, list[Row]]]:
        """(cell, rows) as each cell finishes, in any order; the workers are stopped however the loop ends."""
        if not cells:
            return
        address = self.address or os.environ.get("RAY_ADDRESS")
        ray = import_ray(local=not address)
        started = not ray.is_initialized()
        if started:
            if address:
                _check_reachable(address)
            options = dict(address=address) if address else dict(
                address="local", num_cpus=os.cpu_count(), include_dashboard=False,
                object_store_memory=OBJECT_STORE_BYTES)
            ray.init(**options, log_to_driver=False, logging_level=logging.WARNING)
        actors = []
        try:
            count, gpus = workers(ray.cluster_resources(), self.threads, len(cells))
            remote = ray.remote(num_cpus=self.threads, num_gpus=gpus, max_restarts=RESTARTS,
                                max_task_retries=RESTARTS)(GridWorker)
            actors = [remote.remote(job, self.threads) for _ in range(count)]
            todo, pending = iter(cells), {}  # ObjectRef -> (actor, cell, tries)

            def give(actor, cell=None, tries: int = 0) -> None:  # a cell (the next one) to a worker that has none
                cell = cell if cell is not None else next(todo, None)
                if cell is not None:
                    pending[actor.run.remote(cell)] = (actor, cell, tries)

            for actor in actors:
                give(actor)
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=WAIT_SECONDS)  # Ctrl-C between waits
                if not ready:
                    continue
                actor, cell, tries = pending.pop(ready[0])
                try:
                    result = _result(ray, ready[0])
                except ray.exceptions.ActorUnavailableError:  # unreachable for a while (a stalled node): again
                    if tries >= RESTARTS:
                        raise
                    give(actor, cell, tries + 1)
                    continue
                give(actor)  # before the driver writes the rows: the worker is never idle for it
                yield result
        finally:
            for actor in actors:
                ray.kill(actor)
            if started:
                ray.shutdown()


def _check_reachable(address: str) -> None:
    """A host:port a cluster's head should listen on, tried for CONNECT_SECONDS: Ray itself waits minutes for an
    address nobody answers on. ("auto" and ray:// addresses are left to Ray.)"""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as err:
        raise ConnectionError(f"no Ray cluster answers at {address} ({err}): start one with `ray start --head`, "
                              "or leave the address out to start one here") from None


def workers(resources: dict[str, float], threads: int, cells: int) -> tuple[int, int]:
    """(workers, GPUs each) for a cluster's resources: one worker per GPU where it has GPUs, else one per `threads`
    CPUs; never more workers than cells."""
    gpus = int(resources.get("GPU", 0))
    count = gpus or max(1, int(resources.get("CPU", 1)) // threads)
    return min(count, cells), 1 if gpus else 0


def _result(ray, ref) -> tuple[Cell, list[Row]]:
    """A finished cell's (cell, rows); a cell's own exception raised as itself, a worker's death as a RuntimeError."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        raise err.as_instanceof_cause() from None
    except ray.exceptions.ActorUnavailableError:
        raise
    except ray.exceptions.RayError as err:  # restarts used up, or the job failed to open (its cause in the text)
        lines = [line for line in str(err).splitlines() if line.strip()]
        cause = next((line for line in reversed(lines) if "Error" in line), lines[0] if lines else type(err).__name__)
        raise RuntimeError(f"a Ray worker failed: {cause.strip()}") from err
