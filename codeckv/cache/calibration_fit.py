"""The computation of a PCA calibration: one pass over the calibration windows, a basis per layer, each tier's coder.

    basis, rows = fit_basis(model, ids)           # forward + backward of (N, S) windows: moments, then the bases
    rows = capture_rows(model, ids)               # forward only, when the basis is known already (a saved one)
    rows = capture_gradients(model, ids, accumulate)  # the pass alone: accumulate(layer, x, g) of each window
    ys = basis.project(rows)                      # the sampled rows in each layer's components
    fit = fit_coders(basis, ys, spec)             # one tier's step, kept components and entropy tables

Memory is bounded by one decoder layer's activations and one window's layer inputs, not by the text or the model's
depth: the pass streams window by window, and within a window the backward recomputes one decoder layer at a time
(_layers_recomputed) while the loss's logits exist LOSS_CHUNK positions at a time (_summed_nll). Per full-attention
layer it keeps running sums (float64) of x, x x^T and g g^T, x the (d,) vector of a token's keys (RoPE removed) and
values of every head, g = d(sum of next-token NLL)/d(x), and every SAMPLE_EVERY-th row of x (float32), which is all
that the tiers' steps and tables need afterwards (the first SKIP positions of each window, attention sinks coded
apart, are left out of everything).

1. Basis, per layer (codecs/pca.py): F = E[g g^T] + reg I (empirical Fisher), A = F^1/2, U the PCA of the
   whitened rows A (x - mean): analysis enc = A U, stored in fp16 (a float32 scale per column), and synthesis
   dec = enc^-1, computed in float64 from the fp16 analysis whenever a basis is built or read back. Squared error
   on y = (x - mean) enc then approximates the loss increase. The basis is the same for every tier.
2. Step, per tier: the step whose calibration codes have the tier's bits per element of entropy (bisection:
   reverse water-filling), then the rung of the ladder around it (codecs/rate.py) whose code length under the
   class tables is nearest the budget; components that stay 0 at the ladder's finest step are dropped.
3. Entropy tables (codecs/ans.py): a component's class is its mean |y| in steps, in quarter octaves, so one rung
   coarser is one class down; each class's model is the histogram of the sampled codes of every component and
   rung in that class (a layer's models are shared by its components and rungs).
"""

from __future__ import annotations

import ctypes
import functools
import math
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint
from transformers.cache_utils import (
    DYNAMIC_LAYER_TYPE_MAPPING,
    Cache,
    LinearAttentionCacheLayerMixin,
    get_layer_types_and_kwargs,
)

from codeckv.codecs.ans import EntropyTable
from codeckv.codecs.pca import JointPCA, LayerCoder, ecsq
from codeckv.codecs.rate import LADDER, RUNGS_PER_OCTAVE, ladder_steps
from codeckv.codecs.rope import Rope

try:
    _LIBC = ctypes.CDLL("libc.so.6") if sys.platform.startswith("linux") else None
except OSError:  # a Linux without glibc (musl): nothing to release
    _LIBC = None

Progress = Callable[[float, str], None]  # (fraction of this part done, 0..1; what it is doing)

LOSS_CHUNK = 64  # positions whose logits exist at once in a window's loss (_summed_nll)
SKIP = 4  # leading positions of every calibration window left out of the statistics (attention sinks)
FISHER_REG = 1e-2  # F + FISHER_REG * mean(diag F) * I before its square root
SAMPLE_EVERY = 4  # rows kept for the steps and tables: every 4th position of every window ...
SAMPLE_ALL_BELOW = 4096  # ... unless the windows hold fewer positions than this: then every one (a small calibration)
WATER_SAMPLE_EVERY = 4  # the step's bisection reads every 4th of those (the ladder's rung is then chosen on all)
HALF_PEAK = 1024.0  # an analysis column is stored in fp16 as column / scale, its largest |value| at HALF_PEAK


def _quiet(fraction: float, message: str) -> None:
    """The progress of a computation nobody watches."""


@dataclass
class Basis:
    """Every full-attention layer's Fisher-whitened PCA basis, the same for every tier of a model (module docstring, 1).

    halves and scales are what a file stores; encoders and decoders are computed from them, so a basis read back
    is the basis computed, bit for bit.
    """

    means: dict[int, torch.Tensor]  # layer -> (d,) float32
    halves: dict[int, torch.Tensor]  # layer -> (d, d) float16: the analysis matrix, column j divided by scales[j]
    scales: dict[int, torch.Tensor]  # layer -> (d,) float32
    heads: int  # KV heads
    head_dim: int  # of the keys (values have d / heads - head_dim channels)
    rope: Rope

    def __post_init__(self) -> None:
        self.encoders = {i: h.float() * self.scales[i] for i, h in self.halves.items()}  # (d, d) float32
        self.decoders = {i: torch.from_numpy(np.linalg.inv(e.double().numpy())).float()
                         for i, e in self.encoders.items()}  # (d, d) float32: enc^-1

    def coder(self, index: int, kept: torch.Tensor, step: float, table: EntropyTable, sink_tokens: int,
              component_bits: torch.Tensor) -> LayerCoder:
        """Layer `index`'s coder keeping the (r,) components `kept` of its basis, at a tier's step and tables."""
        return LayerCoder(self.means[index], self.encoders[index][:, kept].contiguous(),
                          self.decoders[index][kept].contiguous(), step, table, self.heads, self.head_dim, self.rope,
                          sink_tokens, component_bits)

    def project(self, rows: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Per layer, (n, d) rows x -> (n, d) components y = (x - mean) enc."""
        return {i: (x - self.means[i]) @ self.encoders[i] for i, x in rows.items()}


class _WindowLayer:
    """Mixed into a cache layer class for one window's forward from empty (_window_layer): its first update may keep
    the (B, H, S, D) states it was handed (`captured`, in the autograd graph); later updates hand back the states
    given, since the backward recomputes each decoder layer (_layers_recomputed), which updates the cache again."""

    capture = False
    updated = False
    captured: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.updated:
            return key_states, value_states
        self.updated = True
        if self.capture:
            self.captured = (key_states, value_states)
        return super().update(key_states, value_states, *args, **kwargs)


@functools.cache
def _window_class(kind: str, capture: bool) -> type:
    base = DYNAMIC_LAYER_TYPE_MAPPING[kind]
    return type(f"Window{base.__name__}", (_WindowLayer, base), {"capture": capture})


def _window_layer(kind: str, capture: bool, **kwargs):
    """A cache layer of `kind` for one window (_WindowLayer), capturing its states if `capture`."""
    return _window_class(kind, capture)(**kwargs)


class _Moments:
    """Running float64 sums over one layer's captured rows: their count, x, x x^T and g g^T."""

    def __init__(self, d: int) -> None:
        self.count = 0
        self.total = torch.zeros(d, dtype=torch.float64)
        self.outer = torch.zeros(d, d, dtype=torch.float64)
        self.fisher = torch.zeros(d, d, dtype=torch.float64)

    def add(self, x: torch.Tensor, g: torch.Tensor) -> None:
        x, g = x.double(), g.double()
        self.count += x.shape[0]
        self.total += x.sum(0)
        self.outer += x.T @ x
        self.fisher += g.T @ g


def fit_basis(model, ids: torch.Tensor, progress: Progress = _quiet) -> tuple[Basis, dict[int, torch.Tensor]]:
    """Forward + backward of the (N, S) calibration windows, one at a time -> the basis of every full-attention
    layer and its sampled rows (module docstring). Needs autograd: call it outside inference mode."""
    config = model.config.get_text_config(decoder=True)
    rope = Rope.from_config(config)
    moments: dict[int, _Moments] = {}

    def accumulate(index: int, x: torch.Tensor, g: torch.Tensor) -> None:
        moments.setdefault(index, _Moments(x.shape[1])).add(x, g)

    geometry: dict[str, int] = {}
    rows = capture_gradients(model, ids, accumulate, lambda f, m: progress(0.9 * f, m), geometry)
    means, halves, scales = {}, {}, {}
    for done, (index, m) in enumerate(sorted(moments.items())):
        progress(0.9 + 0.1 * done / len(moments), f"fitting the basis of layer {done + 1} of {len(moments)}")
        means[index], halves[index], scales[index] = _whitened_pca(m)
    return Basis(means, halves, scales, geometry["heads"], geometry["head_dim"], rope), rows


@contextmanager
def _weights_out_of_autograd(model):
    """The model's parameters not requiring grad for a while (restored after): the backward wants the gradients of
    K and V only, and a weight requiring grad makes autograd keep its inputs too (~0.2 GB more for smollm2-135m)."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def decoder(model) -> tuple[torch.nn.Module, list[torch.nn.Module]]:
    """The module that runs `model`'s decoder layers (called with inputs_embeds and a cache, it returns
    last_hidden_state), and those layers in order: the module list as long as the config's layer count (`layers` in
    most families, `h` in GPT-2's and Falcon's, `blocks` in MPT's) and its parent."""
    count = model.config.get_text_config(decoder=True).num_hidden_layers
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            parent = name.rpartition(".")[0]
            return (model.get_submodule(parent) if parent else model), list(module)
    raise ValueError(f"{type(model).__name__}: no list of {count} decoder layers found (allowed: a transformers "
                     "decoder-only model)")


@contextmanager
def _layers_recomputed(model):
    """Each decoder layer of `model` checkpointed for a while (torch.utils.checkpoint, non-reentrant): a window's
    forward keeps only every layer's input, and the backward recomputes one layer at a time, so the activations of
    one layer, not of all, are held (smollm2-135m, 512-token windows in fp32: the pass's peak fell from 1,234 to
    717 MiB above the loaded model with it and malloc_trim between tables, `python -m codeckv calibrate`).
    A model with a layer that keeps another state than keys and values (linear attention, whose recomputation would
    update its state twice) keeps every layer's activations instead."""
    kinds, _ = get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))
    if any(issubclass(DYNAMIC_LAYER_TYPE_MAPPING[kind], LinearAttentionCacheLayerMixin) for kind in kinds):
        yield
        return
    layers = decoder(model)[1]
    for layer in layers:
        layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward  # the class's own again


def capture_gradients(model, ids: torch.Tensor, accumulate: Callable[[int, torch.Tensor, torch.Tensor], None],
                      progress: Progress = _quiet, geometry: dict | None = None) -> dict[int, torch.Tensor]:
    """Forward + backward of the (N, S) windows, one at a time: accumulate(layer, x, g) of each window's (S - SKIP, d)
    rows x of every full-attention layer and their gradients g (module docstring); returns the sampled rows.
    geometry, if given, receives the cached states' "heads" and key "head_dim". Needs autograd: call it outside
    inference mode."""
    rope = Rope.from_config(model.config.get_text_config(decoder=True))
    with _weights_out_of_autograd(model), _layers_recomputed(model):
        return _capture(model, ids, rope, accumulate, progress, geometry)


def capture_rows(model, ids: torch.Tensor, progress: Progress = _quiet) -> dict[int, torch.Tensor]:
    """Forward only: every full-attention layer's sampled rows of the (N, S) windows (for a basis already known)."""
    config = model.config.get_text_config(decoder=True)
    with torch.no_grad():
        return _capture(model, ids, Rope.from_config(config), None, progress)


def _capture(model, ids: torch.Tensor, rope: Rope, accumulate, progress: Progress,
             geometry: dict | None = None) -> dict[int, torch.Tensor]:
    """One pass over the windows: per full-attention layer, the (N * ceil((S - SKIP) / every), d) float32
    sampled rows; with `accumulate`, a backward too, and accumulate(layer, x, g) of each window's rows. geometry:
    as capture_gradients'."""
    if ids.shape[1] <= SKIP + 1:
        raise ValueError(f"calibration windows of {ids.shape[1]} tokens are too short (allowed: > {SKIP + 1})")
    config = model.config.get_text_config(decoder=True)
    kinds, kwargs = get_layer_types_and_kwargs(config)
    full = [i for i, kind in enumerate(kinds) if kind == "full_attention"]
    if not full:
        raise ValueError("the model has no full-attention layer: nothing for a PCA tier to calibrate")
    every = SAMPLE_EVERY if ids.shape[0] * (ids.shape[1] - SKIP) >= SAMPLE_ALL_BELOW else 1
    per_window = len(range(0, ids.shape[1] - SKIP, every))
    rows: dict[int, torch.Tensor] = {}
    embed = model.get_input_embeddings()
    chunked = accumulate is not None and _head_reproduces_logits(model, ids[:1, :LOSS_CHUNK].to(model.device))
    for n in range(ids.shape[0]):
        release_freed_memory()
        progress(n / ids.shape[0], f"capturing window {n + 1} of {ids.shape[0]}")
        window = ids[n : n + 1].to(model.device)
        layers = [_window_layer(kind, i in full, **kw) for i, (kind, kw) in enumerate(zip(kinds, kwargs))]
        with torch.enable_grad() if accumulate else torch.no_grad():
            embeds = embed(window).detach().requires_grad_(accumulate is not None)
            if accumulate:
                loss = _summed_nll(model, embeds, window[0, 1:], Cache(layers=layers), chunked)
                states = [t for i in full for t in layers[i].captured]
                # embeds too: a node the backward leaves unrun keeps its checkpointed layer's recomputed
                # tensors alive past the window (~50 MB a window otherwise)
                found = torch.autograd.grad(loss, [*states, embeds])[:-1]
            else:
                decoder(model)[0](inputs_embeds=embeds, cache=Cache(layers=layers), use_cache=True)
                states = [t for i in full for t in layers[i].captured]
        if geometry is not None:  # what the cache holds (MLA: one latent "head", not the attention's heads)
            geometry.update(heads=states[0].shape[1], head_dim=states[0].shape[3])
        for j, index in enumerate(full):
            x = _vectors(rope, *(t.detach().float() for t in states[2 * j : 2 * j + 2]))
            if index not in rows:
                rows[index] = torch.empty(ids.shape[0] * per_window, x.shape[1])
            rows[index][n * per_window : (n + 1) * per_window] = x[::every]
            if accumulate:
                accumulate(index, x, _vectors(rope, *(t.float() for t in found[2 * j : 2 * j + 2])))
    progress(1.0, f"captured {ids.shape[0]} windows")
    return rows


def _logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """The model's logits from its last hidden states: the output embeddings, then any final soft-capping."""
    logits = model.get_output_embeddings()(hidden)
    cap = getattr(model.config.get_text_config(decoder=True), "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def _head_reproduces_logits(model, ids: torch.Tensor) -> bool:
    """True when _logits of the decoder's last hidden states are the model's own logits (on a few tokens): then the
    loss can be computed LOSS_CHUNK positions at a time. A model whose head does more falls back to whole logits."""
    with torch.no_grad():
        want = model(ids).logits[0].float()
        got = _logits(model, decoder(model)[0](ids).last_hidden_state)[0].float()
    return want.shape == got.shape and torch.allclose(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def _chunk_nll(model, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(_logits(model, hidden).float(), targets, reduction="sum")


def _summed_nll(model, embeds: torch.Tensor, targets: torch.Tensor, cache: Cache, chunked: bool) -> torch.Tensor:
    """The window's summed next-token NLL (targets: its tokens after the first), in the autograd graph. Chunked, the
    logits of LOSS_CHUNK positions exist at a time, recomputed in the backward (checkpoint): the full (S, vocab)
    logits, their log-softmax and gradient (100 MB each at 512 x 49k in fp32) are never held together (the pass's
    peak fell from 1,309 to 1,234 MiB above the loaded model with it, `python -m codeckv calibrate`)."""
    if not chunked:
        logits = model(inputs_embeds=embeds, cache=cache, use_cache=True).logits[0, :-1]
        return torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum")
    hidden = decoder(model)[0](inputs_embeds=embeds, cache=cache, use_cache=True).last_hidden_state[0, :-1]
    return sum(checkpoint(_chunk_nll, model, hidden[lo : lo + LOSS_CHUNK], targets[lo : lo + LOSS_CHUNK],
                          use_reentrant=False) for lo in range(0, hidden.shape[0], LOSS_CHUNK))


def release_freed_memory() -> None:
    """Hand the memory the last window's forward + backward freed back to the system (glibc keeps it otherwise, and
    the next window's allocations, of other sizes, land beside it: the process peak grew ~0.8 GB over 3 windows)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _vectors(rope: Rope, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Keys (RoPE removed), values (1, H, S, D) -> (S - SKIP, H * (D + Dv)) rows, sinks left out (LayerCoder.rows)."""
    k = rope.remove(keys, 0)[0, :, SKIP:].transpose(0, 1).flatten(1)
    v = values[0, :, SKIP:].transpose(0, 1).flatten(1)
    return torch.cat([k, v], dim=-1).cpu()


def _eigh(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues and eigenvectors of a symmetric float64 matrix, by decreasing eigenvalue (numpy: faster here)."""
    values, vectors = np.linalg.eigh(matrix.numpy())
    return torch.from_numpy(values[::-1].copy()), torch.from_numpy(np.ascontiguousarray(vectors[:, ::-1]))


def _whitened_pca(m: _Moments) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's sums -> mean (d,) float32, the analysis matrix enc in fp16 (d, d) and its (d,) column scales."""
    mean = m.total / m.count
    cov = m.outer / m.count - torch.outer(mean, mean)
    fisher = m.fisher / m.count
    fisher += FISHER_REG * fisher.diagonal().mean().clamp_min(1e-30) * torch.eye(fisher.shape[0], dtype=torch.float64)
    e, w = _eigh(fisher)
    e = e.clamp_min(1e-30)
    root = (w * e.sqrt()) @ w.T
    _, u = _eigh(root @ cov @ root)
    enc = root @ u
    scales = (enc.abs().amax(0).clamp_min(1e-30) / HALF_PEAK).float()
    return mean.float(), (enc / scales.double()).half(), scales


@dataclass
class TierFit:
    """One tier's coders on a basis, and what a file needs to rebuild them from the basis."""

    coders: dict[int, LayerCoder]  # layer -> coder
    kept: dict[int, torch.Tensor]  # layer -> (r,) int64: the basis components the coder keeps
    step: float  # the calibrated step
    bits_per_element: float  # what the sampled calibration codes cost at that step, per element


def fit_coders(basis: Basis, ys: dict[int, torch.Tensor], spec: JointPCA, progress: Progress = _quiet) -> TierFit:
    """One tier's coders from the basis and the sampled components ys (Basis.project; module docstring, 2-3)."""
    progress(0.0, "searching the step")
    step = _water_level({i: y[::WATER_SAMPLE_EVERY] for i, y in ys.items()}, spec.bits_per_element)
    progress(0.3, "choosing the rung")
    step = _recentred(ys, step, spec.bits_per_element)
    coders, kept, bits, elements = {}, {}, 0.0, 0
    for done, (index, y) in enumerate(sorted(ys.items())):
        progress(0.6 + 0.4 * done / len(ys), f"entropy tables of layer {done + 1} of {len(ys)}")
        release_freed_memory()  # each layer's histograms, of other sizes than the last's
        kept[index] = torch.nonzero(_kept(y, step))[:, 0]
        y = y[:, kept[index]]
        classes, counts = _class_counts(y, step)
        table = EntropyTable.from_counts(counts.sum(0), classes)
        limit = (counts.shape[2] - 3) // 2
        codes = ecsq(y, step).clamp_(-limit - 1, limit + 1).long() + limit + 1  # the calibrated step's
        per_code = table.code_bits(limit).double()  # (K, 2 limit + 3)
        component_bits = per_code[classes, codes].sum(0) / y.shape[0]  # (r,) bits per token
        bits += float(component_bits.sum()) * y.shape[0]
        elements += y.shape[0] * basis.means[index].numel()
        coders[index] = basis.coder(index, kept[index], step, table, spec.sink_tokens, component_bits.float())
    return TierFit(coders, kept, step, bits / elements)


def _kept(y: torch.Tensor, step: float) -> torch.Tensor:
    """(d,) bool: the components some sampled row codes to non-zero at the ladder's finest step (at least one)."""
    kept = (ecsq(y, float(ladder_steps(step)[0])) != 0).any(0)
    kept[0] = True
    return kept


def _recentred(ys: dict[int, torch.Tensor], step: float, bits_per_element: float) -> float:
    """The rung of the ladder around `step` whose code length under the class tables (what the coder spends,
    not the plug-in entropy, which short calibrations underestimate) is nearest bits_per_element."""
    bits, elements = torch.zeros(len(LADDER), dtype=torch.float64), 0
    for y in ys.values():
        d = y.shape[1]
        y = y[:, _kept(y, step)]
        classes, counts = _class_counts(y, step)
        table = EntropyTable.from_counts(counts.sum(0), classes)
        bits += (counts.double() * table.code_bits((counts.shape[2] - 3) // 2).double()).sum((1, 2))
        elements += y.shape[0] * d
    rate = bits / elements
    return float(ladder_steps(step)[int((rate.log() - math.log(bits_per_element)).abs().argmin())])


def _class_counts(y: torch.Tensor, step: float, limit: int = 255) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, r) calibration components and the calibrated step -> each component's class (r,) and, per rung, the
    (rungs, K, 2 limit + 3) histograms of the codes of each class (module docstring, 3)."""
    scale = y.abs().mean(0).clamp_min(1e-30) / step  # (r,) mean |y| in steps
    base = torch.round(RUNGS_PER_OCTAVE * torch.log2(scale)).long()
    classes = base - base.min() + max(LADDER)  # every rung's class (classes - rung) is >= 0
    count, width = int(classes.max()) - min(LADDER) + 1, 2 * limit + 3
    counts = torch.zeros(len(LADDER), count * width, dtype=torch.long)
    q = torch.empty_like(y)  # ecsq(y, rung_step) done in place, clamped and offset to its class's bins (floats: exact)
    for j, (shift, rung_step) in enumerate(zip(LADDER, ladder_steps(step).tolist())):
        bins = ((classes - shift) * width + limit + 1).to(y.dtype)
        torch.div(y, rung_step, out=q).round_().clamp_(-limit - 1, limit + 1).add_(bins)
        counts[j] = torch.bincount(q.to(torch.int32).reshape(-1), minlength=count * width)
    return classes, counts.view(len(LADDER), count, width)


def _entropy_bits(codes: torch.Tensor) -> float:
    """Total empirical entropy in bits of the columns of (N, r) integer codes (each column its own histogram)."""
    codes = codes.long()
    low = codes.min(0).values
    span = int((codes.max(0).values - low).max()) + 1
    index = ((codes - low) + torch.arange(codes.shape[1]) * span).reshape(-1)
    if codes.shape[1] * span <= 4 * index.numel():
        counts = torch.bincount(index, minlength=codes.shape[1] * span).double()
    else:  # a fine step spreads the codes wide: count only the values present (a histogram would take GBs)
        counts = torch.unique(index, return_counts=True)[1].double()
    p = counts[counts > 0] / codes.shape[0]
    return float(-(p * torch.log2(p)).sum()) * codes.shape[0]


def _water_level(ys: dict[int, torch.Tensor], bits_per_element: float) -> float:
    """The step whose codes of the (n, d) components ys have `bits_per_element` of entropy per element."""
    def rate(step: float) -> float:
        return sum(_entropy_bits(ecsq(y, step)) for y in ys.values()) / sum(y.numel() for y in ys.values())

    # From a step that codes every component to 0 down to one whose codes still fit the coder's int16 escapes (a
    # budget the calibration rows cannot reach, e.g. 8 bits on a few rows, then gets the finest such step).
    peak = max(float(y.abs().max()) for y in ys.values()) + 1e-30
    low, high = peak * 2.0**-14, 2.0 * peak
    while high / low > 1.01:  # bisection in log space: the rate falls as the step grows
        mid = math.sqrt(low * high)
        low, high = (mid, high) if rate(mid) > bits_per_element else (low, mid)
    return math.sqrt(low * high)
