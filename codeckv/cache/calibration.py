"""Calibration of the PCA tiers: per-layer bases, the quantizer step and the entropy tables, cached on disk.

    calibration = calibration_for(loaded, TIERS["pca-8x"])  # from $CODECKV_CACHE/calibration, or computed and saved
    cache = make_cache(loaded, "pca-8x")                # (codeckv/cache/codec_cache.py calls calibration_for itself)
    calibration = calibrate(model, ids, JointPCA(1.5))  # the computation alone, on any (N, S) token ids

Calibration text: the last windows x length tokens of the embedded corpus (codeckv/corpus.py).
The quality windows and sweeps read the corpus from its start, and the held-out docstrings are never
used, so a tier is never measured on the text it was calibrated on.

Steps (codecs/pca.py holds the coder they produce):
1. Capture: forward + backward of the calibration windows; a capturing cache records every full-attention
   layer's K and V, autograd gives g = d(sum of next-token NLL)/d(K, V). Keys and their gradients are
   de-rotated (RoPE is orthogonal, so the gradient w.r.t. pre-RoPE keys is the de-rotated gradient).
   The first SKIP positions of each window (attention sinks, coded apart) are left out.
2. Per layer, with x the (N, d) vectors of K and V of every head and F = E[g g^T] (empirical Fisher):
   A = (F + reg I)^1/2 and the PCA U of the whitened rows A (x - mean): enc = A U, dec = U^T A^-1.
   Squared error on y = (x - mean) enc then approximates the loss increase.
3. One step for every layer and component, found by bisection so that the entropy of the calibration
   codes is the tier's bits per element (reverse water-filling): the centre of the rate control's ladder
   (codecs/rate.py); components that stay 0 at the ladder's finest step are dropped.
4. Entropy tables (codecs/ans.py): a component's class is its mean |y| in steps, in quarter octaves, so one
   rung coarser is one class down; each class's model is the histogram of the calibration codes of every
   component and rung in that class (a layer's models are shared by its components and rungs).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, Cache, DynamicLayer, get_layer_types_and_kwargs

from codeckv.cache.schedule import tiers_used
from codeckv.codecs.ans import EntropyTable
from codeckv.codecs.pca import JointPCA, LayerCoder, ecsq
from codeckv.codecs.rate import LADDER, RUNGS_PER_OCTAVE, ladder_steps
from codeckv.codecs.rope import Rope
from codeckv.corpus import corpus_text
from codeckv.paths import cache_dir
from codeckv.tiers import Tier

VERSION = 2  # bump when the calibration recipe or the saved format changes: old files are then ignored
SKIP = 4  # leading positions of every calibration window left out of the statistics (attention sinks)
FISHER_REG = 1e-2  # F + FISHER_REG * mean(diag F) * I before its square root
BATCH = 4  # calibration windows per forward + backward
TABLE_SUBSAMPLE = 4  # the entropy tables histogram every 4th calibration row, at each of the 16 rungs


@dataclass
class Calibration:
    """Every full-attention layer's coder for one model and one JointPCA spec, and what calibration measured."""

    model: str
    spec: JointPCA
    coders: dict[int, LayerCoder]  # model layer index -> coder
    step: float
    bits_per_element: float  # entropy of the calibration codes per element, at `step`
    seconds: float  # time the computation took (capture + build)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "version": VERSION, "model": self.model, "spec": asdict(self.spec), "step": self.step,
            "bits_per_element": self.bits_per_element, "seconds": self.seconds,
            "coders": {index: coder.state() for index, coder in self.coders.items()},
        }
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(path)  # atomic: a reader never sees half a file

    @classmethod
    def load(cls, path: Path) -> Calibration:
        state = torch.load(path, weights_only=True)
        if state.get("version") != VERSION:
            raise ValueError(f"{path}: calibration version {state.get('version')} (allowed: {VERSION})")
        coders = {int(i): LayerCoder.from_state(s) for i, s in state["coders"].items()}
        return cls(state["model"], JointPCA(**state["spec"]), coders, state["step"], state["bits_per_element"],
                   state["seconds"])


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


def calibration_dir() -> Path:
    """Where calibrations live: $CODECKV_CACHE/calibration."""
    return cache_dir() / "calibration"


def calibration_path(model: str, spec: JointPCA) -> Path:
    """The file of one (model, spec) calibration: the key is the model name, the spec and VERSION."""
    key = json.dumps({"model": model, "spec": asdict(spec), "version": VERSION}, sort_keys=True)
    safe = "".join(c if c.isalnum() or c in "-." else "_" for c in model)
    return calibration_dir() / f"{safe}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"


_LOADED: dict[Path, Calibration] = {}  # calibrations already read in this process


def calibration_for(loaded, tier: Tier, compute: bool = True) -> Calibration | list[Calibration] | None:
    """The calibration `tier` needs on a LoadedModel (None when it needs none): from memory, from disk, or computed.

    A computed calibration is saved under calibration_dir(); compute=False raises ValueError instead.
    A per-layer schedule (codeckv/cache/schedule.py) gets the list of its PCA tiers' calibrations (None if it has none).
    """
    if tier.per_layer:
        return [calibration_for(loaded, t, compute) for t in tiers_used(tier) if t.joint is not None] or None
    if tier.joint is None:
        return None
    path = calibration_path(loaded.info.name, tier.joint)
    if path not in _LOADED:
        if not path.exists() and not compute:
            raise ValueError(f"tier '{tier.name}' needs a calibration of {loaded.info.name}, and none is saved at "
                             f"{path}: compute it once with "
                             f"codeckv.cache.calibration.calibration_for(loaded, TIERS['{tier.name}'])")
        # Outside any caller's inference mode: tensors made in it could never enter autograd later (calibrate
        # needs autograd, and a calibration read here is shared by the whole process).
        with torch.inference_mode(False):
            if path.exists():
                _LOADED[path] = Calibration.load(path)
            else:
                windows, length = tier.joint.calibration_windows, tier.joint.calibration_length
                calibration = calibrate(loaded.model, calibration_windows(loaded.tokenizer, windows, length),
                                        tier.joint, loaded.info.name)
                calibration.save(path)
                _LOADED[path] = calibration
    return _LOADED[path]


def calibration_windows(tokenizer, windows: int, length: int) -> torch.Tensor:
    """(windows, length) token ids: the last windows x length tokens of the embedded corpus."""
    ids = tokenizer(corpus_text(), return_tensors="pt").input_ids[0]
    if ids.numel() < 2 * windows * length:
        raise ValueError(f"the corpus has {ids.numel()} tokens: too few for {windows} calibration windows of "
                         f"{length} tokens apart from the quality windows (allowed: at most {ids.numel() // 2})")
    return ids[ids.numel() - windows * length :].view(windows, length)


def calibrate(model, ids: torch.Tensor, spec: JointPCA, name: str = "model") -> Calibration:
    """Compute the coders of every full-attention layer of `model` from (N, S) calibration token ids.

    Runs outside inference mode, also when called inside one: the Fisher weights need autograd.
    """
    with torch.inference_mode(False):
        return _calibrate(model, ids.clone(), spec, name)  # a clone: ids made in inference mode can't enter autograd


def _calibrate(model, ids: torch.Tensor, spec: JointPCA, name: str) -> Calibration:
    """calibrate, in normal (non-inference) mode on normal tensors."""
    start = time.perf_counter()
    config = model.config.get_text_config(decoder=True)
    rope = Rope.from_config(config)
    if ids.shape[1] <= SKIP + 1:
        raise ValueError(f"calibration windows of {ids.shape[1]} tokens are too short (allowed: > {SKIP + 1})")
    rows, grads = _capture(model, ids, rope)
    whitened = {index: _whitened_pca(rows[index], grads[index]) for index in rows}
    step = _water_level({i: y for i, (_, _, _, y) in whitened.items()}, spec.bits_per_element)
    step = _recentred(whitened, step, spec.bits_per_element)
    coders, bits, elements = {}, 0.0, 0
    for index, (mean, enc, dec, y) in whitened.items():
        kept = (ecsq(y, float(ladder_steps(step)[0])) != 0).any(0)
        kept[0] = True  # at least one component per layer
        y = y[:, kept]
        classes, counts = _class_counts(y[::TABLE_SUBSAMPLE], step)
        table = EntropyTable.from_counts(counts.sum(0), classes)
        limit = (counts.shape[2] - 3) // 2
        codes = ecsq(y, step).clamp_(-limit - 1, limit + 1).long() + limit + 1  # the calibrated step's
        per_code = table.code_bits(limit).double()  # (K, 2 limit + 3)
        component_bits = per_code[classes, codes].sum(0) / y.shape[0]  # (r,) bits per token
        bits += float(component_bits.sum()) * y.shape[0]
        elements += y.shape[0] * mean.numel()
        coders[index] = LayerCoder(
            mean, enc[:, kept].contiguous(), dec[kept].contiguous(), step, table, config.num_key_value_heads,
            rope.head_dim, rope, spec.sink_tokens, component_bits.float(),
        )
    return Calibration(name, spec, coders, step, bits / elements, time.perf_counter() - start)


class _CapturingLayer(DynamicLayer):
    """A full-attention cache layer that also keeps the (B, H, S, D) states it was handed (in the autograd graph)."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.captured = (key_states, value_states)
        return super().update(key_states, value_states, *args, **kwargs)


def _capture(model, ids: torch.Tensor, rope: Rope) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    """Per full-attention layer: (N * (S - SKIP), d) float32 vectors of pre-RoPE keys + values, and their gradients."""
    config = model.config.get_text_config(decoder=True)
    kinds, kwargs = get_layer_types_and_kwargs(config)
    rows: dict[int, list[torch.Tensor]] = {i: [] for i, kind in enumerate(kinds) if kind == "full_attention"}
    grads: dict[int, list[torch.Tensor]] = {i: [] for i in rows}
    if not rows:
        raise ValueError("the model has no full-attention layer: nothing for a PCA tier to calibrate")
    embed = model.get_input_embeddings()
    with torch.enable_grad():
        for first in range(0, ids.shape[0], BATCH):
            batch = ids[first : first + BATCH].to(model.device)
            layers = [_CapturingLayer() if i in rows else DYNAMIC_LAYER_TYPE_MAPPING[kind](**kw)
                      for i, (kind, kw) in enumerate(zip(kinds, kwargs))]
            embeds = embed(batch).detach().requires_grad_()
            logits = model(inputs_embeds=embeds, cache=Cache(layers=layers), use_cache=True).logits[:, :-1]
            loss = torch.nn.functional.cross_entropy(
                logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="sum"
            )
            states = [t for i in rows for t in layers[i].captured]
            found = torch.autograd.grad(loss, states)
            for j, index in enumerate(rows):
                keys, values = (t.detach().float() for t in states[2 * j : 2 * j + 2])
                g_keys, g_values = (t.float() for t in found[2 * j : 2 * j + 2])
                rows[index].append(_vectors(rope.remove(keys, 0), values))
                grads[index].append(_vectors(rope.remove(g_keys, 0), g_values))
            del logits, loss, found, states, layers
    return {i: torch.cat(r) for i, r in rows.items()}, {i: torch.cat(g) for i, g in grads.items()}


def _vectors(keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Keys, values (B, H, S, D) -> (B * (S - SKIP), H * (D + Dv)) rows, sink positions left out (LayerCoder.rows)."""
    b, _, s, _ = keys.shape
    k = keys[:, :, SKIP:].transpose(1, 2).reshape(b * (s - SKIP), -1)
    v = values[:, :, SKIP:].transpose(1, 2).reshape(b * (s - SKIP), -1)
    return torch.cat([k, v], dim=-1).cpu()


def _eigh(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues and eigenvectors of a symmetric float64 matrix, by decreasing eigenvalue (numpy: faster here)."""
    values, vectors = np.linalg.eigh(matrix.numpy())
    return torch.from_numpy(values[::-1].copy()), torch.from_numpy(np.ascontiguousarray(vectors[:, ::-1]))


def _whitened_pca(x: torch.Tensor, g: torch.Tensor):
    """(N, d) vectors and their loss gradients -> mean (d,), enc (d, d), dec (d, d), y (N, d) (module docstring, 2)."""
    mean = x.double().mean(0)
    centred = x - mean.float()
    cov = (centred.T @ centred / x.shape[0]).double()
    fisher = (g.T @ g / g.shape[0]).double()
    fisher += FISHER_REG * fisher.diagonal().mean().clamp_min(1e-30) * torch.eye(fisher.shape[0], dtype=torch.float64)
    e, w = _eigh(fisher)
    e = e.clamp_min(1e-30)
    root, inverse_root = (w * e.sqrt()) @ w.T, (w / e.sqrt()) @ w.T
    _, u = _eigh(root @ cov @ root)
    enc, dec = (root @ u).float(), (u.T @ inverse_root).float()
    return mean.float(), enc, dec, centred @ enc


def _recentred(whitened: dict, step: float, bits_per_element: float) -> float:
    """The rung of the ladder around `step` whose code length under the class tables (what the coder spends,
    not the plug-in entropy, which short calibrations underestimate) is nearest bits_per_element."""
    bits, elements = torch.zeros(len(LADDER), dtype=torch.float64), 0
    for mean, _, _, y in whitened.values():
        y = y[:, (ecsq(y, float(ladder_steps(step)[0])) != 0).any(0)]
        classes, counts = _class_counts(y[::TABLE_SUBSAMPLE], step)
        table = EntropyTable.from_counts(counts.sum(0), classes)
        bits += (counts.double() * table.code_bits((counts.shape[2] - 3) // 2).double()).sum((1, 2))
        elements += y[::TABLE_SUBSAMPLE].shape[0] * mean.numel()
    rate = bits / elements
    return float(ladder_steps(step)[int((rate.log() - math.log(bits_per_element)).abs().argmin())])


def _class_counts(y: torch.Tensor, step: float, limit: int = 255) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, r) calibration components and the calibrated step -> each component's class (r,) and, per rung, the
    (rungs, K, 2 limit + 3) histograms of the codes of each class (module docstring, 4)."""
    scale = y.abs().mean(0).clamp_min(1e-30) / step  # (r,) mean |y| in steps
    base = torch.round(RUNGS_PER_OCTAVE * torch.log2(scale)).long()
    classes = base - base.min() + max(LADDER)  # every rung's class (classes - rung) is >= 0
    count = int(classes.max()) - min(LADDER) + 1
    width = 2 * limit + 3
    counts = torch.zeros(len(LADDER), count * width, dtype=torch.long)
    for j, (shift, rung_step) in enumerate(zip(LADDER, ladder_steps(step).tolist())):
        q = ecsq(y, rung_step).clamp_(-limit - 1, limit + 1).long() + limit + 1
        counts[j] = torch.bincount((q + (classes - shift) * width).reshape(-1), minlength=count * width)
    return classes, counts.view(len(LADDER), count, width)


def _entropy_bits(codes: torch.Tensor) -> float:
    """Total empirical entropy in bits of the columns of (N, r) integer codes (each column its own histogram)."""
    codes = codes.long()
    low = codes.min(0).values
    span = int((codes.max(0).values - low).max()) + 1
    index = (codes - low) + torch.arange(codes.shape[1]) * span
    counts = torch.bincount(index.reshape(-1), minlength=codes.shape[1] * span).double()
    p = counts[counts > 0] / codes.shape[0]
    return float(-(p * torch.log2(p)).sum()) * codes.shape[0]


def _water_level(ys: dict[int, torch.Tensor], bits_per_element: float, subsample: int = 4) -> float:
    """The step whose codes have `bits_per_element` of entropy per element on (every subsample-th) calibration row."""
    def rate(step: float) -> float:
        bits = sum(_entropy_bits(ecsq(y[::subsample], step)) for y in ys.values())
        return bits / sum(y[::subsample].numel() for y in ys.values())

    low, high = 1e-6, 1e3
    while high / low > 1.01:  # bisection in log space: the rate falls as the step grows
        mid = math.sqrt(low * high)
        low, high = (mid, high) if rate(mid) > bits_per_element else (low, mid)
    return math.sqrt(low * high)
