"""Background preparation: one job at a time, progress anyone can read, a request that waits says so, a saved
calibration is ready at once, a failure reaches every waiter. A stand-in pool and calibration (no model)."""

import threading
import time
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

import codeckv.serve.preparation as preparation
from codeckv.serve.preparation import READY, Preparation
from codeckv.tiers import TIERS

PCA = [name for name, tier in TIERS.items() if tier.joint is not None]


class StandIn:
    """A pool whose model is a name, and a calibration that takes `steps` reported steps (or fails)."""

    def __init__(self, steps=5, saved=(), fails=()):
        self.steps, self.saved, self.fails = steps, set(saved), set(fails)
        self.running, self.most_at_once, self.order = 0, 0, []
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.release.set()

    @contextmanager
    def lease(self, name):
        self.order.append(("load", name))
        yield SimpleNamespace(info=SimpleNamespace(name=name))

    def calibration_for(self, loaded, tier, compute=True, progress=None):
        if tier.name in self.saved:
            return "saved"
        if not compute:
            raise ValueError("none saved")
        with self.lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        self.order.append(("calibrate", tier.name))
        try:
            for step in range(self.steps):
                self.release.wait()
                progress(step / self.steps, f"step {step}")
                time.sleep(0.01)
            if tier.name in self.fails:
                raise RuntimeError("out of memory")
            self.saved.add(tier.name)
            return "computed"
        finally:
            with self.lock:
                self.running -= 1


@pytest.fixture
def stand_in(monkeypatch):
    fake = StandIn()
    monkeypatch.setattr(preparation, "calibration_for", fake.calibration_for)
    monkeypatch.setattr(preparation, "POLL_SECONDS", 0.01)
    return fake


def _loaded(name="smollm2-135m"):
    return SimpleNamespace(info=SimpleNamespace(name=name))


def test_start_loads_the_model_then_calibrates_every_pca_tier_one_at_a_time(stand_in):
    prep = Preparation(stand_in)
    prep.start("smollm2-135m")
    for name in PCA:
        list(prep.wait_for(_loaded(), TIERS[name]))  # returns once that tier's calibration is done
    assert stand_in.order[0] == ("load", "smollm2-135m"), "the model first"
    assert [name for step, name in stand_in.order if step == "calibrate"] == PCA
    assert stand_in.most_at_once == 1, "at most one calibration at a time"
    assert prep.status_text() == "", "nothing left to say once every tier is ready"


def test_a_request_waits_with_progress_and_a_saved_calibration_is_ready_at_once(stand_in):
    stand_in.saved.add("pca-16x")
    prep = Preparation(stand_in)
    assert list(prep.wait_for(_loaded(), TIERS["pca-16x"])) == [], "saved: no wait, no line"
    stand_in.release.clear()  # hold the calibration at its first step, so its progress can be read
    lines = prep.wait_for(_loaded("hub/model"), TIERS["pca-8x"])  # a hub model's first use queues its job
    first = next(lines)
    assert first.startswith("pca-8x: "), first
    stand_in.release.set()
    rest = list(lines)
    assert any("calibrating" in line and "%" in line for line in [first, *rest]), [first, *rest]
    assert ("calibrate", "pca-8x") in stand_in.order and prep._jobs[("hub/model", "pca-8x")].state == READY


def test_the_status_says_what_runs_how_far_and_what_waits(stand_in):
    stand_in.release.clear()
    prep = Preparation(stand_in)
    prep.start("smollm2-135m")
    deadline = time.monotonic() + 5
    while "calibrating" not in prep.status_text() and time.monotonic() < deadline:
        time.sleep(0.01)
    status = prep.status_text()
    first, *rest = [name for name, tier in TIERS.items() if tier.joint is not None]
    assert f"{first}: calibrating, 0%" in status, status
    assert all(f"{name}: queued" in status for name in rest), status
    stand_in.release.set()


def test_a_failed_calibration_reaches_its_waiters_as_a_clear_error(stand_in):
    stand_in.fails.add("pca-32x")
    prep = Preparation(stand_in)
    with pytest.raises(ValueError, match="calibration of pca-32x for smollm2-135m failed: out of memory"):
        list(prep.wait_for(_loaded(), TIERS["pca-32x"]))
    assert "pca-32x: failed (out of memory)" in prep.status_text()


def test_eta_reads_in_seconds_then_minutes():
    assert preparation._eta(10, 0.01) == "", "too early to say"
    assert preparation._eta(20, 0.5) == "about 20 s" and preparation._eta(60, 0.25) == "about 3 min"


def test_the_operator_can_leave_preparation_to_the_requests(stand_in, monkeypatch):
    monkeypatch.setenv("CODECKV_PREPARE", "0")
    prep = Preparation(stand_in)
    prep.start("smollm2-135m")
    assert stand_in.order == [] and prep.status_text() == "", "nothing started in the background"
    list(prep.wait_for(_loaded(), TIERS["pca-8x"]))  # a request still gets its calibration, in turn
    assert ("calibrate", "pca-8x") in stand_in.order
