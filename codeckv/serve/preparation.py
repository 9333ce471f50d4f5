"""What the app computes before a visitor needs it: a model's conversion and its PCA tiers' calibrations, in the
background, one job at a time, with progress that any request can read or wait on.

    PREPARATION.start("smollm2-135m")                  # app start: load (convert) it, then calibrate every PCA tier
    PREPARATION.status_text()                          # "pca-8x: calibrating, 40%, about 1 min left · ..."
    for line in PREPARATION.wait_for(loaded, tier):    # a request: progress lines until what `tier` needs is ready
        ...
    PREPARATION.not_ready(loaded, tier)                # "" when ready, else what is under way (without waiting)

Jobs run on one worker thread in the order they were asked for, so at most one calibration runs at a time; a
request for a tier whose calibration is not ready (a hub model's first use, or before the start-up jobs reach it)
queues that job if nobody has, and streams its progress while it waits (a short chat does not wait: its cache holds
its tokens raw, which needs no calibration; codeckv/serve/service.py, may_archive). A calibration that was saved before
(`$CODECKV_CACHE/calibration`, e.g. by the Docker image's `scripts/setup.sh --convert`) is read back at once.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from codeckv.cache.calibration import calibration_for
from codeckv.cache.schedule import tiers_used
from codeckv.loaded import LoadedModel
from codeckv.serve.pool import POOL, ModelPool
from codeckv.tiers import TIERS, Tier

QUEUED, RUNNING, READY, FAILED = "queued", "running", "ready", "failed"
POLL_SECONDS = 1.0  # how often a waiting request looks at its job


@dataclass
class Job:
    """One model's conversion (tier None) or one PCA tier's calibration for a model."""

    model: str
    tier: Tier | None
    state: str = QUEUED
    fraction: float = 0.0
    message: str = ""
    error: str = ""
    started: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def label(self) -> str:
        return self.tier.name if self.tier is not None else self.model

    def text(self) -> str:
        """One line for the stats and the tier picker, e.g. 'pca-8x: calibrating, 40%, about 1 min left'."""
        what = "calibrating" if self.tier is not None else "loading (its first start converts the GGUF once)"
        if self.state == RUNNING:
            eta = _eta(time.monotonic() - self.started, self.fraction)
            return f"{self.label}: {what}, {self.fraction:.0%}" + (f", {eta} left" if eta else "")
        return f"{self.label}: {self.state}" + (f" ({self.error})" if self.error else "")


def _eta(elapsed: float, fraction: float) -> str:
    """'about 1 min left' from the time spent and the share done (nothing until 5% is done)."""
    if fraction < 0.05:
        return ""
    left = elapsed * (1 - fraction) / fraction
    return f"about {round(left / 60)} min" if left >= 90 else f"about {max(5, round(left / 5) * 5)} s"


class Preparation:
    """The background jobs of one process (module docstring)."""

    def __init__(self, pool: ModelPool = POOL) -> None:
        self._pool = pool
        self._jobs: dict[tuple[str, str | None], Job] = {}
        self._queue: queue.Queue[Job] = queue.Queue()
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None

    def start(self, model: str) -> None:
        """Queue `model`'s conversion and the calibration of every PCA tier of TIERS for it, unless the operator
        set CODECKV_PREPARE=0 (then a request computes what it needs when it first needs it, still one at a time)."""
        if os.environ.get("CODECKV_PREPARE", "1").strip() == "0":
            return
        self._ask(model, None)
        for tier in TIERS.values():
            if tier.joint is not None:
                self._ask(model, tier)

    def wait_for(self, loaded: LoadedModel, tier: Tier) -> Iterator[str]:
        """Progress lines until every calibration `tier` needs is ready; a failed one raises its reason."""
        for plain in (t for t in tiers_used(tier) if t.joint is not None):
            job = self._ready_or_asked(loaded, plain)
            last = None
            while not job.done.wait(timeout=0 if last is None else POLL_SECONDS):
                line = job.text() if job.state == RUNNING else self._queued_text(job)
                if line != last:
                    yield line
                    last = line
            if job.state == FAILED:
                raise ValueError(f"the calibration of {plain.name} for {loaded.info.name} failed: {job.error}")

    def not_ready(self, loaded: LoadedModel, tier: Tier) -> str:
        """What is under way for `tier` ("" when every calibration it needs is ready), asking for it if nobody has."""
        return next(iter(self.wait_for(loaded, tier)), "")

    def status_text(self) -> str:
        """Every job not yet ready, one line each (empty once everything asked for is ready)."""
        with self._lock:
            jobs = [job for job in self._jobs.values() if job.state != READY]
        return " · ".join(job.text() for job in jobs)

    def _ready_or_asked(self, loaded: LoadedModel, tier: Tier) -> Job:
        """The job of `tier`'s calibration: done at once when one is saved, else queued (once)."""
        key = (loaded.info.name, tier.name)
        with self._lock:
            job = self._jobs.get(key)
        if job is None:
            try:
                calibration_for(loaded, tier, compute=False)
                job = Job(loaded.info.name, tier, READY)
                job.done.set()
                with self._lock:
                    self._jobs.setdefault(key, job)
            except ValueError:  # none saved yet: compute it in the background, in turn
                job = self._ask(loaded.info.name, tier)
        return job

    def _queued_text(self, job: Job) -> str:
        """'pca-16x: queued behind pca-8x': the jobs asked for before it that are not done."""
        with self._lock:
            jobs = list(self._jobs.values())  # in the order they were asked for
        ahead = [j.label for j in jobs[: jobs.index(job)] if j.state in (QUEUED, RUNNING)]
        return f"{job.label}: queued" + (f" behind {', '.join(ahead)}" if ahead else "")

    def _ask(self, model: str, tier: Tier | None) -> Job:
        key = (model, tier.name if tier is not None else None)
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                job = self._jobs[key] = Job(model, tier)
                self._queue.put(job)
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._work, name="codeckv-preparation", daemon=True)
                self._worker.start()
        return job

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            job.state, job.started = RUNNING, time.monotonic()
            try:
                with self._pool.lease(job.model) as loaded:
                    if job.tier is not None:
                        calibration_for(loaded, job.tier, progress=lambda f, m, job=job: _report(job, f, m))
                job.state, job.fraction = READY, 1.0
            except Exception as err:  # noqa: BLE001 - kept as the job's reason; every waiter raises it
                job.state, job.error = FAILED, str(err).splitlines()[0] if str(err) else type(err).__name__
            finally:
                job.done.set()


def _report(job: Job, fraction: float, message: str) -> None:
    job.fraction, job.message = max(0.0, min(1.0, fraction)), message


PREPARATION = Preparation()
