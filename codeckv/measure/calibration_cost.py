"""What computing a model's PCA calibrations costs: the pass's seconds, the files it saves, and the process's peak
memory above the loaded model, measured on an empty calibration folder (Linux: /proc/self/status).

    rows = calibration_cost(loaded, Path("out/calibration"), progress)   # one row per PCA tier of TIERS

"The loaded model" is the process once a first forward has read the weights in (load_model maps the weights
file: until a forward touches them they are not resident, and a peak measured from the load would count them as
the calibration's). The peak is VmHWM over the pass, reset just before it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from codeckv.cache.calibration import basis_path, calibrate_all, calibration_dir, calibration_path
from codeckv.cache.calibration_fit import release_freed_memory
from codeckv.loaded import LoadedModel
from codeckv.measure.memory import proc_status_bytes
from codeckv.tiers import TIERS


@dataclass
class CalibrationCost:
    """One PCA tier of a calibration pass (the pass computes every tier: its seconds and peak are shared)."""

    model: str
    tier: str
    bits_per_element: float  # the calibration codes' entropy per element at the tier's step
    tier_file_bytes: int  # what the tier adds to the basis
    basis_file_bytes: int  # the model's basis, shared by its tiers
    pass_seconds: float  # the whole pass: the capture of every window, the basis, every tier
    model_rss_bytes: int  # the process before the pass, the model's weights resident
    peak_rss_bytes: int  # VmHWM over the pass
    above_model_bytes: int  # peak_rss_bytes - model_rss_bytes


@contextmanager
def _calibrations_in(folder: Path) -> Iterator[None]:
    """calibration_dir() is `folder`/calibration for a while ($CODECKV_CACHE, restored after)."""
    before = os.environ.get("CODECKV_CACHE")
    os.environ["CODECKV_CACHE"] = str(folder)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CODECKV_CACHE", None)
        else:
            os.environ["CODECKV_CACHE"] = before


def calibration_cost(loaded: LoadedModel, folder: Path,
                     progress: Callable[[float, str], None] | None = None) -> list[CalibrationCost]:
    """Compute every PCA tier of TIERS for `loaded` into `folder` (which must hold no calibration), measured."""
    if loaded.model.device.type != "cpu":
        raise ValueError("the calibration cost is measured on CPU (the process's resident memory)")
    with _calibrations_in(folder):
        if calibration_dir().exists() and any(calibration_dir().iterdir()):
            raise ValueError(f"{calibration_dir()} holds calibrations already (allowed: an empty folder)")
        with torch.no_grad():  # the weights in: the loaded model as a served one is
            loaded.model(torch.tensor([[loaded.tokenizer.eos_token_id or 0] * 8]))
        release_freed_memory()
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = proc_status_bytes("VmRSS")
        calibrations = calibrate_all(loaded, progress=progress)
        peak = proc_status_bytes("VmHWM")
        tiers = [t for t in TIERS.values() if t.joint is not None]
        name = loaded.info.name
        basis = {(t.joint.calibration_windows, t.joint.calibration_length) for t in tiers}
        basis_bytes = sum(basis_path(name, *key).stat().st_size for key in basis)
        return [CalibrationCost(name, t.name, calibrations[t.name].bits_per_element,
                                calibration_path(name, t.joint).stat().st_size, basis_bytes,
                                calibrations[t.name].seconds, before, peak, peak - before) for t in tiers]
