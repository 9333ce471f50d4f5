"""PCA calibration (codeckv/cache/calibration.py): one pass for every tier calibrated on the same text, a basis
computed once and shared, files read back bit for bit, one calibration at a time whose progress others see (in a
process, and across processes sharing the folder), and a calibration text apart from every quality window. Small
calibrations (2 windows of 64 tokens) of the embedded model."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import codeckv.cache.calibration as calibration
from codeckv.cache.calibration_fit import Basis, _Moments, _whitened_pca
from codeckv.codecs.pca import JointPCA
from codeckv.codecs.rope import Rope
from codeckv.corpus import bible_held_out_text, bible_text, corpus_text, leading_tokens, text_windows
from codeckv.paths import cache_dir
from codeckv.tiers import TIERS, Tier

SMALL_TEXT = {"calibration_windows": 2, "calibration_length": 64}
COARSE = Tier("pca-small-coarse", "a small calibration", joint=JointPCA(0.5, **SMALL_TEXT))
FINE = Tier("pca-small-fine", "a small calibration", joint=JointPCA(2.0, **SMALL_TEXT))
LATER = Tier("pca-small-later", "a tier on the same text, not among TIERS", joint=JointPCA(1.0, **SMALL_TEXT))
MODEL = "smollm2-135m"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty calibration folder, a process that has read none, and COARSE and FINE as the PCA tiers of TIERS.

    The folder links the converted model and the compiled kernels of the cache the suite warmed: a process that loads
    the model from it (the second process, `codeckv calibrate`) reads them instead of converting the GGUF file again
    (15 s of a 28 s test); the calibrations alone start from nothing."""
    warmed = cache_dir()
    for held in (MODEL, "kernels"):
        if (warmed / held).is_dir():
            (tmp_path / held).symlink_to(warmed / held)
    monkeypatch.setenv("CODECKV_CACHE", str(tmp_path))
    monkeypatch.setattr(calibration, "_LOADED", {})
    monkeypatch.setattr(calibration, "_BASES", {})
    monkeypatch.setattr(calibration, "TIERS", {t.name: t for t in (COARSE, FINE)})


def _new_process(monkeypatch) -> None:
    """Forget every calibration read or computed: only the files remain."""
    monkeypatch.setattr(calibration, "_LOADED", {})
    monkeypatch.setattr(calibration, "_BASES", {})


def _counted(monkeypatch, name: str) -> list:
    """Count the calls of calibration.<name> (a step of the computation)."""
    calls, real = [], getattr(calibration, name)
    monkeypatch.setattr(calibration, name, lambda *args: calls.append(1) or real(*args))
    return calls


def _same(a: calibration.Calibration, b: calibration.Calibration) -> bool:
    """Two calibrations hold the same numbers, bit for bit."""
    return a.step == b.step and sorted(a.coders) == sorted(b.coders) and all(
        torch.equal(x, y)
        for i in a.coders
        for x, y in zip((a.coders[i].mean, a.coders[i].enc, a.coders[i].dec, a.coders[i].component_bits,
                         *a.coders[i].table.state().values()),
                        (b.coders[i].mean, b.coders[i].enc, b.coders[i].dec, b.coders[i].component_bits,
                         *b.coders[i].table.state().values()))
    )


def test_one_tier_computes_every_tier_on_its_text_in_one_pass_read_back_bit_for_bit(loaded, fresh, monkeypatch):
    fits = _counted(monkeypatch, "fit_basis")
    seen = []
    coarse = calibration.calibration_for(loaded, COARSE, progress=lambda fraction, message: seen.append((fraction,
                                                                                                         message)))
    assert fits == [1], "one forward + backward pass"
    assert calibration.basis_path(MODEL, 2, 64).exists()
    assert calibration.calibration_path(MODEL, COARSE.joint).exists()
    assert calibration.calibration_path(MODEL, FINE.joint).exists(), "its sibling, calibrated in the same pass"
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[0] == 0.0 and fractions[-1] == 1.0
    assert "capturing window 2 of 2" in {m for _, m in seen}
    assert any(m.startswith("pca-small-fine: entropy tables of layer") for _, m in seen)
    fine = calibration.calibration_for(loaded, FINE)
    assert coarse.step > fine.step, "half a bit per element takes a coarser step than two"
    assert torch.equal(coarse.coders[3].mean, fine.coders[3].mean), "one basis for both tiers"

    _new_process(monkeypatch)
    assert _same(calibration.calibration_for(loaded, COARSE, compute=False), coarse)
    assert _same(calibration.calibration_for(loaded, FINE, compute=False), fine)
    assert fits == [1]


def test_a_tier_calibrated_later_reuses_the_saved_basis_with_a_forward_only_pass(loaded, fresh, monkeypatch):
    first = calibration.calibration_for(loaded, COARSE)
    _new_process(monkeypatch)
    fits, captures = _counted(monkeypatch, "fit_basis"), _counted(monkeypatch, "capture_rows")
    later = calibration.calibration_for(loaded, LATER)
    assert fits == [] and captures == [1]
    assert torch.equal(later.coders[5].mean, first.coders[5].mean)
    assert first.coders[5].kept < later.coders[5].kept, "a finer step keeps more components of the same basis"


def test_a_tier_file_is_ignored_without_the_basis_it_was_fitted_on(loaded, fresh, monkeypatch):
    calibration.calibration_for(loaded, COARSE)
    calibration.basis_path(MODEL, 2, 64).unlink()
    _new_process(monkeypatch)
    with pytest.raises(ValueError, match="none is saved"):
        calibration.calibration_for(loaded, COARSE, compute=False)


def test_one_calibration_at_a_time_and_the_others_see_it(loaded, fresh, monkeypatch):
    """While a pass runs, its tiers read 'running' with its last progress; a caller for one of them waits and is
    told that progress; a caller for another tier is 'queued', then computes it on the saved basis."""
    started, finish = threading.Event(), threading.Event()
    fits, real = [], calibration.fit_basis

    def held_fit(model, ids, progress):
        fits.append(1)
        progress(0.5, "held by the test")
        started.set()
        assert finish.wait(60)
        return real(model, ids, progress)

    monkeypatch.setattr(calibration, "fit_basis", held_fit)
    told: dict[str, list[str]] = {"fine": [], "later": []}
    callers = [threading.Thread(target=calibration.calibration_for, args=(loaded, COARSE))]
    callers[0].start()
    assert started.wait(60)
    for key, tier in (("fine", FINE), ("later", LATER)):
        callers.append(threading.Thread(target=calibration.calibration_for,
                                         kwargs={"loaded": loaded, "tier": tier,
                                                 "progress": lambda f, m, key=key: told[key].append(m)}))
        callers[-1].start()
    deadline = time.monotonic() + 30
    while not (told["fine"] and told["later"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    status = calibration.calibration_status(MODEL)
    finish.set()
    for caller in callers:
        caller.join(600)  # returns once done: the bound is for a machine busy with other work
    assert status["pca-small-coarse"] == status["pca-small-fine"] == ("running", 0.4, "held by the test")
    assert status["pca-small-later"].state == "queued"
    assert told["fine"][0] == "held by the test", "a caller waiting for a tier being computed sees its progress"
    assert told["later"][0].startswith("waiting for another calibration to finish (smollm2-135m pca-small-")
    assert fits == [1] and calibration.calibration_path(MODEL, LATER.joint).exists()
    assert calibration.calibration_status(MODEL) == {}, "nothing queued or running once they are done"


OTHER_PROCESS = """
import sys
import codeckv.cache.calibration as calibration
from codeckv.models import load_model
from tests.cache.test_calibration import COARSE, FINE

calibration.TIERS = {t.name: t for t in (COARSE, FINE)}
real = calibration.fit_basis

def held_fit(model, ids, progress):
    print("holding", flush=True)
    sys.stdin.readline()
    return real(model, ids, progress)

calibration.fit_basis = held_fit
calibration.calibration_for(load_model(), COARSE)
"""


def test_a_second_process_waits_for_the_first_and_reads_what_it_saved(loaded, fresh, monkeypatch):
    """Two processes on one folder (an app and a CLI, or make test's two workers): while one computes a model's
    calibrations, the other waits on the folder's lock file, told so, then reads the files instead of computing."""
    other = subprocess.Popen([sys.executable, "-c", OTHER_PROCESS], cwd=ROOT, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get(
                                 "PYTHONPATH")]))})
    try:
        assert other.stdout.readline().strip() == "holding", "the other process reached its pass"
        fits, told, found = _counted(monkeypatch, "fit_basis"), [], []
        waiting = threading.Thread(target=lambda: found.append(calibration.calibration_for(
            loaded, FINE, progress=lambda f, m: told.append(m))))
        waiting.start()
        deadline = time.monotonic() + 60
        while not told and time.monotonic() < deadline:
            time.sleep(0.05)
        assert told and told[0] == "waiting for another process's calibration of smollm2-135m to finish", told[:1]
        assert waiting.is_alive() and fits == []
        other.stdin.write("go\n")
        other.stdin.flush()
        assert other.wait(300) == 0
        waiting.join(120)
    finally:
        other.kill()
    assert fits == [], "read from the files the other process saved, not computed again"
    _new_process(monkeypatch)
    assert found and _same(found[0], calibration.calibration_for(loaded, FINE, compute=False))


def test_the_fp16_basis_inverts_exactly_with_every_component_kept():
    """The analysis matrix is stored in fp16; the synthesis is its float64 inverse, so x -> y -> x is exact."""
    torch.manual_seed(0)
    x = torch.randn(600, 32) @ torch.randn(32, 32)
    g = torch.randn(600, 32) * torch.linspace(0.1, 3, 32)
    moments = _Moments(32)
    moments.add(x, g)
    basis = Basis(*({0: t} for t in _whitened_pca(moments)), heads=1, head_dim=16, rope=Rope.default(16, 1e4))
    y = basis.project({0: x})[0]
    torch.testing.assert_close(y @ basis.decoders[0] + basis.means[0], x, rtol=1e-4, atol=1e-4,
                               msg="x -> y -> x with every component")
    assert basis.halves[0].dtype == torch.float16


def test_calibration_text_is_apart_from_the_quality_windows(loaded):
    """Half the corpus's last tokens (quality reads it from its start), half chapters of the New Testament
    (quality reads the Bible from Genesis: the first 64 windows of 513 tokens end in the Old Testament)."""
    spec = TIERS["pca-8x"].joint
    windows, length = spec.calibration_windows, spec.calibration_length
    ids = calibration.calibration_windows(loaded.tokenizer, windows, length)
    corpus = loaded.tokenizer(corpus_text(), return_tensors="pt").input_ids[0]
    assert torch.equal(ids[: windows // 2].reshape(-1), corpus[-windows // 2 * length :])
    assert text_windows(loaded.tokenizer, corpus_text(), 64, 513).numel() < corpus.numel() - windows // 2 * length
    new_testament = bible_held_out_text()
    assert loaded.tokenizer.decode(ids[windows // 2, :6]).startswith("Matthew 1\n")
    assert all(loaded.tokenizer.decode(w[:12]) in new_testament for w in ids[windows // 2 :])
    read = loaded.tokenizer.decode(leading_tokens(loaded.tokenizer, bible_text(), 64 * 513)[: 64 * 513])
    assert len(read) < bible_text().index(new_testament)


def test_the_calibrate_command_measures_a_pass_on_an_empty_folder(loaded, fresh, monkeypatch, tmp_path):
    """codeckv calibrate (measure/calibration_cost.py): every PCA tier computed into the folder, its files and a
    peak above the loaded model; a folder holding calibrations already is refused (it would measure a read)."""
    from codeckv.measure import calibration_cost as cost

    monkeypatch.setattr(cost, "TIERS", {t.name: t for t in (COARSE, FINE)})
    rows = cost.calibration_cost(loaded, tmp_path / "first")
    assert [r.tier for r in rows] == ["pca-small-coarse", "pca-small-fine"]
    assert all(r.tier_file_bytes > 0 and r.basis_file_bytes > r.tier_file_bytes for r in rows)
    assert all(r.peak_rss_bytes >= r.model_rss_bytes and r.above_model_bytes == r.peak_rss_bytes - r.model_rss_bytes
               for r in rows)
    assert rows[0].bits_per_element < rows[1].bits_per_element, "each tier its own budget"
    with pytest.raises(ValueError, match="holds calibrations already"):
        cost.calibration_cost(loaded, tmp_path / "first")


def test_the_chunked_loss_gives_the_gradients_of_the_whole_logits(loaded, monkeypatch):
    """The calibration's loss, its logits LOSS_CHUNK positions at a time (recomputed in the backward), has the
    gradients w.r.t. K and V of the loss on the whole logits, up to float summation order."""
    from codeckv.cache import calibration_fit

    ids = calibration.calibration_windows(loaded.tokenizer, 2, 3 * calibration_fit.LOSS_CHUNK + 5)
    assert calibration_fit._head_reproduces_logits(loaded.model, ids[:1, :16]), "smollm2's loss is chunked"

    def gradients(chunked: bool) -> dict[int, torch.Tensor]:
        monkeypatch.setattr(calibration_fit, "_head_reproduces_logits", lambda *_: chunked)
        found: dict[int, list] = {}
        with torch.inference_mode(False):
            calibration_fit.capture_gradients(loaded.model, ids.clone(),
                                              lambda i, x, g: found.setdefault(i, []).append(g))
        return {i: torch.cat(g) for i, g in found.items()}

    whole, chunked = gradients(False), gradients(True)
    assert sorted(whole) == sorted(chunked) and len(whole) == 30
    for i in whole:
        scale = whole[i].abs().max()
        assert scale > 0 and torch.allclose(chunked[i], whole[i], rtol=1e-3, atol=1e-4 * scale), i


def test_the_calibrate_command_prints_the_cost_and_writes_its_csv(fresh, monkeypatch, tmp_path, capsys):
    import csv

    from codeckv.cli import main
    from codeckv.measure import calibration_cost as cost

    monkeypatch.setattr(cost, "TIERS", {t.name: t for t in (COARSE, FINE)})
    assert main(["calibrate", "--offline", "--into", str(tmp_path / "into"), "--out", str(tmp_path / "c.csv")]) == 0
    printed = capsys.readouterr().out
    assert "above_model_mib" in printed and "pca-small-coarse" in printed and "pca-small-fine" in printed
    rows = list(csv.DictReader((tmp_path / "c.csv").open()))
    assert [r["tier"] for r in rows] == ["pca-small-coarse", "pca-small-fine"]
    assert (tmp_path / "into" / "calibration").is_dir(), "--into keeps the files"
