"""Calibration of the PCA tiers: what a calibration is, where it is saved, and when it is computed (one at a time).

    calibration = calibration_for(loaded, TIERS["pca-8x"])  # from memory, from disk, or computed and saved
    calibrations = calibrate_all(loaded)                    # every PCA tier of TIERS, in one pass where missing
    calibration_for(loaded, tier, progress=lambda fraction, message: ...)   # see a computation advance
    calibration = ready_or_deferred(loaded, tier)           # the Chat's: ready now, or read at the first archive
    calibration_status("smollm2-135m")  # {"pca-8x": CalibrationStatus("running", 0.4, "capturing window 13 of 32")}
    calibration = calibrate(model, ids, JointPCA(1.5))      # the computation alone, on any (N, S) token ids

A PCA tier's coder per layer (codecs/pca.py) is a basis, the same for every tier of a model, and what each tier
adds: its step, its kept components, its entropy tables (cache/calibration_fit.py computes both). So one pass over
the calibration text serves every tier: computing one PCA tier computes every PCA tier of TIERS calibrated on the
same text, and saves, under $CODECKV_CACHE/calibration, one basis file per model (fp16) and one small file per tier.
At most one calibration computes at a time in a process, and one per model across the processes sharing the folder
(a lock file); others wait for it, and calibration_status shows them.
A cache that holds its tokens raw until its N (cache/pca_layer.py) needs no coder before it first archives: it can
take a Deferred calibration (ready_or_deferred), read or computed at that moment, so a short chat never waits for one.

Calibration text (calibration_windows): half its windows the last tokens of the embedded corpus, half spread over
the King James Bible's New Testament (codeckv/corpus.py). Quality windows read a text from its start (the corpus,
the Bible from Genesis) and the held-out docstrings are never read, so no tier is measured on its calibration text.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import torch

try:
    import fcntl
except ImportError:  # Windows: no lock across processes (_other_processes_done)
    fcntl = None

from codeckv.cache.calibration_fit import Basis, Progress, TierFit, capture_rows, fit_basis, fit_coders
from codeckv.cache.calibration_text import calibration_dir, calibration_windows
from codeckv.cache.kv_scales import KVScales, kv_scales, needs_scales
from codeckv.cache.schedule import tiers_used
from codeckv.codecs.ans import EntropyTable
from codeckv.codecs.pca import JointPCA, LayerCoder
from codeckv.codecs.rope import Rope
from codeckv.tiers import TIERS, Tier

VERSION = 5  # bump when the calibration recipe or the saved format changes: old files are then ignored
WAIT_POLL_SECONDS = 0.5  # a caller waiting for another calibration reports its progress this often


@dataclass
class Calibration:
    """Every full-attention layer's coder for one model and one JointPCA spec, and what calibration measured."""

    model: str
    spec: JointPCA
    coders: dict[int, LayerCoder]  # model layer index -> coder
    step: float
    bits_per_element: float  # code length of the sampled calibration codes per element, at `step`
    seconds: float  # time the pass that computed it took (every tier it computed, the capture included)


class CalibrationStatus(NamedTuple):
    """A calibration queued or running in this process, as its last progress report left it."""

    state: str  # "queued" (waiting for another calibration to finish) or "running"
    fraction: float  # 0..1 of its pass
    message: str  # e.g. "capturing window 12 of 32"


def budget_shares(calibration: Calibration, layers=None) -> dict[int, float]:
    """Each layer's share of its tier's bits per element, over `layers` (default: every calibrated layer).

    At the one calibrated step, layers cost different bits (0.3x to 1.5x the mean on smollm2-135m): a share
    is a layer's calibrated bits per element over the mean of `layers`, weighted by elements, so the shares
    of `layers` times their elements sum to their elements and the layers together keep the tier's budget,
    while each one's rate control (codecs/rate.py) centres on the common step instead of on an equal split.
    A coder without calibrated bits (component_bits None) takes an equal share.
    """
    layers = sorted(calibration.coders) if layers is None else sorted(layers)
    coders = [calibration.coders[i] for i in layers]
    if any(c.component_bits is None for c in coders):
        return dict.fromkeys(layers, 1.0)
    bits = [float(c.component_bits.sum()) for c in coders]  # per token
    elements = [c.mean.numel() for c in coders]
    mean = sum(bits) / sum(elements)
    return {i: b / e / mean for i, b, e in zip(layers, bits, elements)}


def _safe(model: str) -> str:
    """A model name as a file name: letters, digits, '-' and '.' kept, anything else '_'."""
    return "".join(c if c.isalnum() or c in "-." else "_" for c in model)


def _file(model: str, kind: str, key: dict) -> Path:
    safe = _safe(model)
    digest = hashlib.sha256(json.dumps({**key, "model": model, "version": VERSION}, sort_keys=True).encode())
    return calibration_dir() / f"{safe}{kind}-{digest.hexdigest()[:16]}.pt"


def calibration_path(model: str, spec: JointPCA) -> Path:
    """The file of one (model, spec) calibration, the tier's part: the key is the model name, the spec and VERSION."""
    return _file(model, "", {"spec": asdict(spec)})


def basis_path(model: str, windows: int, length: int) -> Path:
    """The file of a model's basis, shared by its tiers calibrated on `windows` x `length` tokens."""
    return _file(model, "-basis", {"windows": windows, "length": length})


_LOADED: dict[Path, Calibration] = {}  # calibrations already read or computed in this process
_BASES: dict[Path, tuple[Basis, str]] = {}  # bases already read or computed, with their digest
_COMPUTING = threading.Lock()  # held by the one calibration computing in this process
_STATUS_LOCK = threading.Lock()
_STATUS: dict[str, dict[str, CalibrationStatus]] = {}  # model -> tier name -> status, while queued or running


def calibration_status(model: str) -> dict[str, CalibrationStatus]:
    """Tier name -> CalibrationStatus of every calibration of `model` queued or running now (thread-safe; a tier
    absent is neither: calibrated, or never asked for)."""
    with _STATUS_LOCK:
        return dict(_STATUS.get(model, {}))


def calibration_for(loaded, tier: Tier, compute: bool = True,
                    progress: Progress | None = None) -> Calibration | KVScales | list | None:
    """The calibration `tier` needs on a LoadedModel (None when it needs none): from memory, from disk, or computed.
    A tier whose FP8 codecs take calibrated scales gets the model's KVScales (cache/kv_scales.py: seconds).

    Computing it computes every PCA tier of TIERS calibrated on the same text (calibrate_all) and saves them under
    calibration_dir(); compute=False raises ValueError instead. progress(fraction, message) is called as the
    computation advances (fraction 0..1 of the pass), and while it waits for another calibration to finish.
    A per-layer schedule (codeckv/cache/schedule.py) gets the list of its PCA tiers' calibrations (None if it has none).
    """
    if tier.per_layer:
        found = [calibration_for(loaded, t, compute, progress) for t in tiers_used(tier) if t.joint is not None]
        return found + ([kv_scales(loaded)] if needs_scales(tier) else []) or None
    if needs_scales(tier):
        return kv_scales(loaded)
    if tier.joint is None:
        return None
    return calibrate_all(loaded, [tier], compute, progress)[tier.name]


class Deferred:
    """A plain PCA tier's calibration on a LoadedModel, read from memory or disk (or computed) when first resolved.

    `loaded` may be set to None while nothing resolves it (an idle chat, measure/chat.py: it holds no model, so a
    model the pool drops is freed) and to the model of the same name again before anything does.
    """

    def __init__(self, loaded, tier: Tier) -> None:
        self.loaded, self.tier = loaded, tier
        self._lock = threading.Lock()
        self._calibration: Calibration | None = None

    def resolve(self) -> Calibration:
        with self._lock:
            if self._calibration is None:
                if self.loaded is None:
                    raise RuntimeError(f"the calibration of tier '{self.tier.name}' was asked for while its cache "
                                       "held no model (give it one first: Run.bind)")
                self._calibration = calibration_for(self.loaded, self.tier)
            return self._calibration


def ready_or_deferred(loaded, tier: Tier) -> Calibration | Deferred | list[Calibration] | None:
    """`tier`'s calibration when it is ready (in memory or saved); a Deferred one for a plain PCA tier whose is not;
    otherwise as calibration_for (None for a tier that needs none, a schedule's list computed where missing)."""
    if tier.joint is not None and not tier.per_layer:
        try:
            return calibration_for(loaded, tier, compute=False)
        except ValueError:  # not computed yet: read (or computed) at the cache's first archive
            return Deferred(loaded, tier)
    return calibration_for(loaded, tier)


def calibrate_all(loaded, tiers: list[Tier] | None = None, compute: bool = True,
                  progress: Progress | None = None) -> dict[str, Calibration]:
    """Tier name -> Calibration of every PCA tier of `tiers` (default: every PCA tier of TIERS) on a LoadedModel.

    Those missing from memory and disk are computed together with every other missing PCA tier of TIERS calibrated
    on the same text, one capture pass for all, and saved (compute=False raises ValueError instead).
    """
    tiers = [t for t in (TIERS.values() if tiers is None else tiers) if t.joint is not None]
    name = loaded.info.name
    # Outside any caller's inference mode: tensors made in it could never enter autograd later (fitting a basis
    # needs autograd, and a calibration read here is shared by the whole process).
    with torch.inference_mode(False):
        missing = [t for t in tiers if _read(name, t.joint) is None]
        if missing and not compute:
            tier = missing[0]
            raise ValueError(f"tier '{tier.name}' needs a calibration of {name}, and none is saved at "
                             f"{calibration_path(name, tier.joint)}: compute it once with "
                             f"codeckv.cache.calibration.calibration_for(loaded, TIERS['{tier.name}'])")
        if missing:
            texts = {(t.joint.calibration_windows, t.joint.calibration_length) for t in missing}
            siblings = [t for t in TIERS.values() if t.joint is not None and t not in missing
                        and (t.joint.calibration_windows, t.joint.calibration_length) in texts]
            _compute(loaded, missing + [t for t in siblings if _read(name, t.joint) is None], progress,
                     [t.name for t in missing])
        return {t.name: _read(name, t.joint) for t in tiers}


def calibrate(model, ids: torch.Tensor, spec: JointPCA, name: str = "model") -> Calibration:
    """Compute the coders of every full-attention layer of `model` from (N, S) calibration token ids (nothing saved).

    Runs outside inference mode, also when called inside one: the Fisher weights need autograd.
    """
    start = time.perf_counter()
    with torch.inference_mode(False):
        basis, rows = fit_basis(model, ids.clone())  # a clone: ids made in inference mode can't enter autograd
        fit = fit_coders(basis, basis.project(rows), spec)
    return Calibration(name, spec, fit.coders, fit.step, fit.bits_per_element, time.perf_counter() - start)


def _compute(loaded, tiers: list[Tier], progress: Progress | None, asked: list[str]) -> None:
    """Compute and save the calibrations of `tiers`, once this process runs no other calibration; while it waits,
    progress hears of the pass computing one of the `asked` tiers, if one is."""
    name = loaded.info.name
    claimed = _claim(name, [t.name for t in tiers])
    try:
        while not _COMPUTING.acquire(timeout=WAIT_POLL_SECONDS):
            if progress:
                progress(*_waiting(name, asked))
        try:
            with _other_processes_done(name, progress):
                by_text: dict[tuple[int, int], list[Tier]] = {}
                for t in tiers:
                    if _read(name, t.joint) is None:  # another caller may have computed it while this one waited
                        by_text.setdefault((t.joint.calibration_windows, t.joint.calibration_length), []).append(t)
                for (windows, length), group in by_text.items():
                    _compute_pass(loaded, windows, length, group, _reporter(name, group, progress))
        finally:
            _COMPUTING.release()
    finally:
        with _STATUS_LOCK:
            for tier_name in claimed:
                _STATUS[name].pop(tier_name, None)


@contextmanager
def _other_processes_done(model: str, progress: Progress | None) -> Iterator[None]:
    """Hold `model`'s lock file in calibration_dir() (fcntl.flock, released if the process dies), so two processes
    sharing $CODECKV_CACHE (an app and a CLI, two test workers) compute a model's calibrations once: the second
    waits, then reads what the first saved. Where fcntl is missing (Windows) each process computes its own."""
    if fcntl is None:
        yield
        return
    path = calibration_dir() / f"{_safe(model)}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if progress:
                    progress(0.0, f"waiting for another process's calibration of {model} to finish")
                time.sleep(WAIT_POLL_SECONDS)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _compute_pass(loaded, windows: int, length: int, tiers: list[Tier], report: Progress) -> None:
    """One pass over the calibration text: the basis (read back if saved, else fitted and saved), then each tier."""
    start = time.perf_counter()
    name = loaded.info.name
    ids = calibration_windows(loaded.tokenizer, windows, length)
    found = _read_basis(name, windows, length)
    fitted = 0.8 if found is None else 0.4  # the share of the pass its capture takes (forward + backward, or forward)
    if found is None:
        basis, rows = fit_basis(loaded.model, ids, _part(report, 0.0, fitted))
        digest = _save_basis(basis_path(name, windows, length), name, basis)
    else:
        (basis, digest), rows = found, capture_rows(loaded.model, ids, _part(report, 0.0, fitted))
    ys = basis.project(rows)
    del rows
    share = (1.0 - fitted) / len(tiers)
    fits = []
    for k, tier in enumerate(tiers):
        part = _part(report, fitted + k * share, fitted + (k + 1) * share, f"{tier.name}: ")
        fits.append(fit_coders(basis, ys, tier.joint, part))
    seconds = time.perf_counter() - start
    for tier, fit in zip(tiers, fits):
        calibration = Calibration(name, tier.joint, fit.coders, fit.step, fit.bits_per_element, seconds)
        path = calibration_path(name, tier.joint)
        _save_tier(path, calibration, fit, digest)
        _LOADED[path] = calibration
    report(1.0, f"calibrated {', '.join(t.name for t in tiers)} in {seconds:.0f} s")


def _part(progress: Progress, start: float, end: float, prefix: str = "") -> Progress:
    """progress of a part of a pass that spans [start, end] of it."""
    return lambda fraction, message: progress(start + fraction * (end - start), prefix + message)


def _claim(model: str, names: list[str]) -> list[str]:
    """Mark `names` queued unless another caller has them queued or running already -> those marked here."""
    with _STATUS_LOCK:
        states = _STATUS.setdefault(model, {})
        claimed = [n for n in names if n not in states]
        for n in claimed:
            states[n] = CalibrationStatus("queued", 0.0, "waiting for another calibration to finish")
        return claimed


def _reporter(model: str, tiers: list[Tier], progress: Progress | None) -> Progress:
    """What a pass reports to: the status of its tiers, and the caller's progress."""
    def report(fraction: float, message: str) -> None:
        with _STATUS_LOCK:
            for t in tiers:
                _STATUS.setdefault(model, {})[t.name] = CalibrationStatus("running", fraction, message)
        if progress:
            progress(fraction, message)

    return report


def _waiting(model: str, names: list[str]) -> tuple[float, str]:
    """(fraction, message) for a caller waiting on the lock: the pass computing its tiers if one is, else why."""
    with _STATUS_LOCK:
        for n in names:
            status = _STATUS.get(model, {}).get(n)
            if status is not None and status.state == "running":
                return status.fraction, status.message
        running = [f"{m} {n}" for m, states in _STATUS.items() for n, s in states.items() if s.state == "running"]
    return 0.0, f"waiting for another calibration to finish ({', '.join(running) or 'starting'})"


def _read(model: str, spec: JointPCA) -> Calibration | None:
    """The calibration of (model, spec) from memory or disk; None if absent or made on another basis than the saved."""
    path = calibration_path(model, spec)
    if path not in _LOADED and path.exists():
        found = _read_basis(model, spec.calibration_windows, spec.calibration_length)
        state = torch.load(path, weights_only=True)
        if found is not None and state.get("version") == VERSION and state["basis"] == found[1]:
            _LOADED[path] = _tier_from_state(state, found[0])
    return _LOADED.get(path)


def _read_basis(model: str, windows: int, length: int) -> tuple[Basis, str] | None:
    """A model's basis and its digest, from memory or disk; None if not saved."""
    path = basis_path(model, windows, length)
    if path not in _BASES and path.exists():
        state = torch.load(path, weights_only=True)
        if state.get("version") == VERSION:
            layers = state["layers"]
            basis = Basis({i: s["mean"] for i, s in layers.items()}, {i: s["half"] for i, s in layers.items()},
                          {i: s["scale"] for i, s in layers.items()}, state["heads"], state["head_dim"],
                          Rope.from_state(state["rope"]))
            _BASES[path] = basis, _digest(basis)
    return _BASES.get(path)


def _digest(basis: Basis) -> str:
    """sha256 of what a basis file stores (a tier's file names the basis it was fitted on)."""
    digest = hashlib.sha256()
    for index in sorted(basis.means):
        for t in (basis.means[index], basis.halves[index], basis.scales[index]):
            digest.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _save(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}-{threading.get_ident()}.tmp")
    torch.save(state, tmp)
    tmp.replace(path)  # atomic: a reader never sees half a file


def _save_basis(path: Path, model: str, basis: Basis) -> str:
    """Save a basis (fp16 analysis matrices, their scales, the means, the geometry) -> its digest."""
    layers = {i: {"mean": basis.means[i], "half": basis.halves[i], "scale": basis.scales[i]} for i in basis.means}
    _save(path, {"version": VERSION, "model": model, "heads": basis.heads, "head_dim": basis.head_dim,
                 "rope": basis.rope.state(), "layers": layers})
    digest = _digest(basis)
    _BASES[path] = basis, digest
    return digest


def _save_tier(path: Path, calibration: Calibration, fit: TierFit, basis_digest: str) -> None:
    """Save what a tier adds to its basis: per layer its kept components, entropy tables and calibrated bits."""
    layers = {}
    for index, coder in calibration.coders.items():
        table = coder.table
        valid = torch.arange(table.probs.shape[1])[None, :] < 2 * table.offset[:, None] + 2  # past: zeros
        layers[index] = {"kept": fit.kept[index], "probs": table.probs[valid], "offset": table.offset,
                         "classes": table.classes, "component_bits": coder.component_bits}
    _save(path, {"version": VERSION, "model": calibration.model, "spec": asdict(calibration.spec),
                 "basis": basis_digest, "step": calibration.step, "bits_per_element": calibration.bits_per_element,
                 "seconds": calibration.seconds, "layers": layers})


def _tier_from_state(state: dict, basis: Basis) -> Calibration:
    """A saved tier's Calibration on its basis."""
    spec = JointPCA(**state["spec"])
    coders = {}
    for index, s in state["layers"].items():
        offset = s["offset"]
        width = int(2 * offset.max() + 2)
        probs = torch.zeros(offset.numel(), width)
        probs[torch.arange(width)[None, :] < 2 * offset[:, None] + 2] = s["probs"]
        coders[index] = basis.coder(index, s["kept"], state["step"], EntropyTable(probs, offset, s["classes"]),
                                    spec.sink_tokens, s["component_bits"])
    return Calibration(state["model"], spec, coders, state["step"], state["bits_per_element"], state["seconds"])
