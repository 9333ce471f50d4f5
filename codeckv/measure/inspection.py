"""KV inspection: capture every layer's K and V after a prefill, pass them through a tier, measure what changed.

    capture = capture_kv(loaded, "The history of the printing press")
    view = inspect_capture(capture, "jpeg-k2", layer=3, head=1)
    view.head.key, view.head.key_recon, view.head.key_error     # (S, D) each, for heatmaps
    view.spectrum.key_energy                                    # (L, r) mean DCT energy per frequency
    view.channels.key_share                                     # (L, H*D) energy in the top-r principal components
    view.layers[3].key_psnr_db, view.layers[3].attention_rel_error

Reconstruction goes through a real `CodecLayer` (a `PCALayer` with the model's calibration
for a PCA tier, codeckv/cache/pca_layer.py): the prefilled tokens are written to it and flushed,
so exactly the blocks the cache would archive go through encode/decode, and the sinks, the
recent window and the incomplete tail stay raw. Layers that are not full attention keep
their native cache, so their reconstruction is the original.

The channel spectrum is the other axis: the share of energy the top-r principal components of a
layer's K (or V), all heads together, capture — where the PCA tiers find their redundancy — and,
for a PCA tier, the bits its calibration spends on each joint K+V component.

Attention-output error uses a stand-in query: per KV head, the last token's captured
(post-RoPE) key plays the query, softmax(q Kᵀ / √d) V is computed with the original
and with the reconstructed K and V, and the relative error of the two outputs is
averaged over heads. Real queries would need model-specific hooks (RoPE, q-norm).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from transformers import DynamicCache

from codeckv.cache import make_cache
from codeckv.cache.calibration import Calibration, budget_shares, calibration_for
from codeckv.cache.kv_scales import KVScales, needs_scales
from codeckv.cache.layers import CodecLayer
from codeckv.cache.pca_layer import PCALayer
from codeckv.cache.schedule import check_layers, codes_layer
from codeckv.codecs.dct import DCT, dct_basis
from codeckv.loaded import LoadedModel
from codeckv.measure.side_by_side import Prompt, prompt_ids
from codeckv.tiers import Tier

DEFAULT_BLOCK = 8  # DCT block for the spectrum of a tier without a DCT codec


@dataclass
class KVCapture:
    """K and V of every layer after one prefill, in the model's dtype and device."""

    token_ids: list[int]
    tokens: list[str]  # (S,) each token as text, for heatmap axes
    layer_types: list[str]  # "full_attention", "sliding_attention", ...
    keys: list[torch.Tensor]  # L x (H, S, D)
    values: list[torch.Tensor]  # L x (H, S, Dv)


@dataclass
class HeadView:
    """One (layer, head): original, reconstructed and |error|, each (S, D) fp32 on CPU."""

    layer: int
    head: int
    archived: tuple[int, int]  # tokens [start, end) went through the codec; the others are raw
    key: torch.Tensor
    key_recon: torch.Tensor
    key_error: torch.Tensor
    value: torch.Tensor
    value_recon: torch.Tensor
    value_error: torch.Tensor
    kept: torch.Tensor | None = None  # (S,) bool: the tokens this head's press kept (None: no press); the others are
    # blank (nan) in the reconstruction and the error


@dataclass
class Spectrum:
    """Mean DCT-II energy per frequency within blocks of r tokens, per layer."""

    block_size: int  # r
    k: int  # frequencies the tier keeps (r when the tier has no DCT)
    key_energy: torch.Tensor  # (L, r) mean over heads, blocks and channels of coefficient²
    value_energy: torch.Tensor  # (L, r)

    @property
    def key_kept(self) -> torch.Tensor:
        """(L,) fraction of key energy in the k lowest frequencies."""
        return kept_fraction(self.key_energy, self.k)

    @property
    def value_kept(self) -> torch.Tensor:
        """(L,) fraction of value energy in the k lowest frequencies."""
        return kept_fraction(self.value_energy, self.k)


@dataclass
class ChannelSpectrum:
    """Per layer, the energy share of the top-r principal components across all heads' channels (r = 1, 2, ...)."""

    key_share: torch.Tensor  # (L, H*D) cumulative share of the (mean-centred) key energy; keys as cached (RoPE in)
    value_share: torch.Tensor  # (L, H*Dv)
    bits: dict[int, torch.Tensor]  # PCA tier: layer -> calibrated mean bits per token of each kept K+V component

    def components_for(self, share: float) -> tuple[list[int], list[int]]:
        """Per layer, the fewest components holding `share` of the energy: (keys, values)."""
        def count(cumulative: torch.Tensor) -> list[int]:
            return [int((row < share).sum()) + 1 for row in cumulative]

        return count(self.key_share), count(self.value_share)


@dataclass
class LayerError:
    """What a tier did to one layer's K and V (all heads, all tokens)."""

    layer: int
    layer_type: str
    codec: bool  # the layer carries the codec (full attention); others stay native
    tier: str  # the tier of this layer (a per-layer schedule gives layers their own: codeckv/cache/schedule.py)
    ratio_vs_bf16: float  # the layer's stored bytes (archive + raw tokens) / bf16 of its tokens; nan if native
    key_rel_error: float  # ||K̂ - K||_F / ||K||_F
    value_rel_error: float
    key_psnr_db: float  # 20 log10(max|K|) - 10 log10(MSE); inf when exact
    value_psnr_db: float
    key_cosine: float  # mean over (head, token) of cos(k̂, k)
    value_cosine: float
    attention_rel_error: float  # relative error of the stand-in query's attention output, mean over heads
    key_var_ratio: float  # Var(ΔK)/Var(K) along the sequence: ~0 smooth, 2 white noise
    value_var_ratio: float
    kept_pct: float = 100.0  # % of the tokens a press kept (over heads); the errors are over the kept ones


@dataclass
class Inspection:
    """A tier on one capture: one head's heatmaps, the spectra and per-layer errors."""

    tier: str
    tokens: list[str]
    head: HeadView
    spectrum: Spectrum
    channels: ChannelSpectrum
    layers: list[LayerError]

    def summary(self) -> dict:
        """Plain numbers for JSON: per-layer errors, spectra, kept fractions."""
        return {
            "tier": self.tier,
            "layer": self.head.layer,
            "head": self.head.head,
            "tokens": len(self.tokens),
            "archived": list(self.head.archived),
            "kept_tokens": None if self.head.kept is None else int(self.head.kept.sum()),
            "block_size": self.spectrum.block_size,
            "k": self.spectrum.k,
            "key_energy": self.spectrum.key_energy.tolist(),
            "value_energy": self.spectrum.value_energy.tolist(),
            "key_kept": self.spectrum.key_kept.tolist(),
            "value_kept": self.spectrum.value_kept.tolist(),
            "key_components_for_99pct": self.channels.components_for(0.99)[0],
            "value_components_for_99pct": self.channels.components_for(0.99)[1],
            "layers": [asdict(e) for e in self.layers],
        }


@torch.inference_mode()
def capture_kv(loaded: LoadedModel, prompt: Prompt) -> KVCapture:
    """Prefill `prompt` (text, chat messages or (1, T) ids) through a DynamicCache and keep every layer's K, V."""
    ids = prompt_ids(loaded, prompt)  # (1, S)
    cache = DynamicCache(config=loaded.model.config)
    loaded.model(input_ids=ids, cache=cache, use_cache=True)
    token_ids = ids[0].tolist()
    return KVCapture(
        token_ids=token_ids,
        tokens=[loaded.tokenizer.decode([t]) for t in token_ids],
        layer_types=list(loaded.info.layer_types),
        keys=[layer.keys[0].clone() for layer in cache.layers],  # (H, S, D); sliding layers hold their window
        values=[layer.values[0].clone() for layer in cache.layers],
    )


def reconstruct(tier: Tier, keys: torch.Tensor, values: torch.Tensor, index: int = 0,
                calibration: Calibration | list[Calibration] | None = None) -> tuple[torch.Tensor, torch.Tensor, tuple]:
    """K, V (H, S, D) of layer `index` through `tier` as the cache stores them -> (K̂, V̂, archived span [start, end)).

    tier: a plain tier or a per-layer schedule (layer `index` uses its own tier). calibration: the model's
    Calibration, needed by a PCA tier (its coder is per layer); a list of them for a schedule of PCA tiers.
    """
    tier = tier.tier_at(index)
    if tier.is_native:
        return keys.clone(), values.clone(), (0, 0)
    layer = _coded(tier, keys, values, index, calibration)
    span = (tier.keep_first, tier.keep_first + layer.footprint(index).archived_tokens)
    return layer.keys[0].clone(), layer.values[0].clone(), span


def _coded(tier: Tier, keys: torch.Tensor, values: torch.Tensor, index: int, calibration) -> CodecLayer:
    """A codec layer of the plain `tier` holding K, V (H, S, D) as a prefill leaves them, archived where it would
    (an FP8 tier with calibrated scales takes layer `index`'s, from the KVScales among `calibration`)."""
    if needs_scales(tier):
        scales = [c for c in (calibration if isinstance(calibration, list) else [calibration])
                  if isinstance(c, KVScales)]
        if not scales:
            raise ValueError(f"tier '{tier.name}' needs the model's FP8 scales (codeckv.cache.kv_scales.kv_scales)")
        tier = scales[0].tier_at(tier, index)
    if tier.joint is not None:
        calibration = _calibration_of(calibration, tier)
    if tier.joint is None:
        layer = CodecLayer(tier)
    else:  # the share a cache of this tier on every layer gives it
        layer = PCALayer(tier, calibration.coders[index], budget_shares(calibration)[index])
    layer.update(keys[None], values[None])  # (1, H, S, D) prefill, raw
    layer.flush()  # archive every complete block outside the sinks and the recent window, decode in place
    return layer


def _calibration_of(calibration, tier: Tier) -> Calibration:
    """The calibration of a PCA tier among `calibration` (one, a list, or None)."""
    found = [c for c in (calibration if isinstance(calibration, list) else [calibration])
             if c is not None and c.spec == tier.joint]
    if not found:
        raise ValueError(f"tier '{tier.name}' needs the model's calibration "
                         "(codeckv.cache.calibration.calibration_for)")
    return found[0]


def dct_energy(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """Mean energy per DCT-II frequency over complete blocks of x (H, S, D) along S -> (block_size,).

    The basis is orthonormal, so the energies sum to the mean block energy (Parseval).
    """
    h, s, d = x.shape
    nb = s // block_size
    if nb == 0:
        return torch.full((block_size,), math.nan)
    blocks = x[:, : nb * block_size].float().cpu().reshape(h, nb, block_size, d)  # (H, nb, r, D)
    coeffs = torch.einsum("jr,hnrd->hnjd", dct_basis(block_size, block_size), blocks)  # (H, nb, r, D)
    return coeffs.pow(2).mean(dim=(0, 1, 3))


def kept_fraction(energy: torch.Tensor, k: int) -> torch.Tensor:
    """(L, r) energies -> (L,) fraction held by the k lowest frequencies."""
    return energy[:, :k].sum(-1) / energy.sum(-1)


def spectrum(capture: KVCapture, tier: Tier, block_size: int | None = None) -> Spectrum:
    """Per-layer DCT spectra of K and V with the tier's block size and k (DEFAULT_BLOCK, k=r without a DCT)."""
    dct = next((c for c in (tier.key, tier.value) if isinstance(c, DCT)), None)
    r = block_size or (dct.block_size if dct else DEFAULT_BLOCK)
    k = dct.k if dct and dct.block_size == r else r
    return Spectrum(
        block_size=r,
        k=k,
        key_energy=torch.stack([dct_energy(x, r) for x in capture.keys]),
        value_energy=torch.stack([dct_energy(x, r) for x in capture.values]),
    )


def principal_share(x: torch.Tensor) -> torch.Tensor:
    """x (H, S, D) -> (H*D,) share of the mean-centred energy in the top-r principal components (r = 1 .. H*D)."""
    rows = x.float().cpu().transpose(0, 1).reshape(x.shape[1], -1)  # (S, H*D): every head's channels of a token
    rows = rows - rows.mean(0)
    energy = torch.linalg.eigvalsh(rows.T.double() @ rows.double()).flip(0).clamp_min(0)  # (H*D,) decreasing
    return (energy.cumsum(0) / energy.sum().clamp_min(1e-30)).float()


def channel_spectrum(capture: KVCapture, calibration: Calibration | None = None) -> ChannelSpectrum:
    """Principal-component energy shares of every layer's K and V, and a PCA tier's calibrated bits per component."""
    bits = {} if calibration is None else {i: c.component_bits for i, c in calibration.coders.items()}
    return ChannelSpectrum(
        key_share=torch.stack([principal_share(k) for k in capture.keys]),
        value_share=torch.stack([principal_share(v) for v in capture.values]),
        bits=bits,
    )


def layer_errors(capture: KVCapture, tier: Tier, calibration: Calibration | list[Calibration] | None = None,
                 kept: dict[int, torch.Tensor] | None = None) -> list[LayerError]:
    """The tier and bytes of every layer, its relative error, PSNR, cosine, attention-output error, Var(Δ)/Var(X);
    where a press evicted (`kept`: layer -> (H, S) kept tokens), over the tokens it kept, and its share kept."""
    out = []
    kept = kept or {}
    for index, (keys, values, kind) in enumerate(zip(capture.keys, capture.values, capture.layer_types)):
        layer_tier = tier.tier_at(index) if codes_layer(kind, tier.tier_at(index)) else None
        codec = layer_tier is not None and not layer_tier.is_native
        ratio = math.nan
        if codec:
            coded = _coded(layer_tier, keys, values, index, calibration)
            fp = coded.footprint(index)
            keys_hat, values_hat, ratio = coded.keys[0], coded.values[0], fp.archive_bytes / fp.bf16_bytes
        else:
            keys_hat, values_hat = keys, values
        k, v, k_hat, v_hat = (t.float().cpu() for t in (keys, values, keys_hat, values_hat))
        mask = kept.get(index)
        if mask is not None:  # the kept tokens of each head, side by side: (1, kept tokens of every head, D)
            k, v, k_hat, v_hat = (t[mask][None] for t in (k, v, k_hat, v_hat))
        out.append(
            LayerError(
                layer=index,
                layer_type=kind,
                codec=codec,
                tier=layer_tier.name if codec else "native",
                ratio_vs_bf16=ratio,
                key_rel_error=relative_error(k, k_hat),
                value_rel_error=relative_error(v, v_hat),
                key_psnr_db=psnr_db(k, k_hat),
                value_psnr_db=psnr_db(v, v_hat),
                key_cosine=mean_cosine(k, k_hat),
                value_cosine=mean_cosine(v, v_hat),
                attention_rel_error=attention_error(k, v, k_hat, v_hat),
                key_var_ratio=var_delta_ratio(k),
                value_var_ratio=var_delta_ratio(v),
                kept_pct=100.0 if mask is None else 100.0 * float(mask.float().mean()),
            )
        )
    return out


def inspect_capture(capture: KVCapture, tier: Tier, layer: int = 0, head: int = 0,
                    calibration: Calibration | list[Calibration] | None = None,
                    kept: dict[int, torch.Tensor] | None = None) -> Inspection:
    """Heatmaps of (layer, head), spectra and per-layer errors of `tier` on a capture (calibration: PCA tiers).

    tier: a plain tier or a per-layer schedule (codeckv/cache/schedule.py), checked against the capture's layers.
    kept: for a tier with a press, layer -> (H, S) the tokens it kept (kept_tokens): the others are blank.
    """
    check_layers(tier, capture.layer_types)
    layers, heads = len(capture.keys), capture.keys[0].shape[0]
    if not (0 <= layer < layers and 0 <= head < heads):
        raise ValueError(f"layer={layer}, head={head} out of range (layers 0..{layers - 1}, heads 0..{heads - 1})")
    keys, values = capture.keys[layer], capture.values[layer]
    if codes_layer(capture.layer_types[layer], tier.tier_at(layer)):  # a window: the tokens it holds, coded
        keys_hat, values_hat, span = reconstruct(tier, keys, values, layer, calibration)
    else:
        keys_hat, values_hat, span = keys, values, (0, 0)
    k, k_hat, v, v_hat = (t[head].float().cpu() for t in (keys, keys_hat, values, values_hat))  # (S, D)
    head_kept = None if kept is None or layer not in kept else kept[layer][head]
    if head_kept is not None:  # an evicted token has no reconstruction
        k_hat, v_hat = (t.masked_fill(~head_kept[:, None], math.nan) for t in (k_hat, v_hat))
    view = HeadView(layer, head, span, k, k_hat, (k_hat - k).abs(), v, v_hat, (v_hat - v).abs(), head_kept)
    shown = calibration[0] if isinstance(calibration, list) and calibration else calibration  # its bits per component
    return Inspection(tier.name, capture.tokens, view, spectrum(capture, tier.tier_at(layer)),
                      channel_spectrum(capture, shown or None), layer_errors(capture, tier, calibration, kept))


def inspect_tier(loaded: LoadedModel, prompt: Prompt, tier: Tier, layer: int = 0, head: int = 0) -> Inspection:
    """capture_kv then inspect_capture (with the model's calibrations for the PCA tiers it uses, and the tokens a
    press keeps)."""
    capture = capture_kv(loaded, prompt)
    calibration = calibration_for(loaded, tier)
    kept = kept_tokens(loaded, capture, tier, calibration) if tier.evicts else None
    return inspect_capture(capture, tier, layer, head, calibration, kept)


@torch.inference_mode()
def kept_tokens(loaded: LoadedModel, capture: KVCapture, tier: Tier, calibration=None) -> dict[int, torch.Tensor]:
    """Per layer a press evicted from, (H, S) True where each KV head kept the token: the capture's tokens
    prefilled through `tier`'s own cache in one forward (its press scores them in attention)."""
    cache = make_cache(loaded, tier, calibration=calibration)
    loaded.model(torch.tensor([capture.token_ids], device=loaded.model.device), cache=cache)
    kept = {}
    for index, layer in enumerate(cache.layers):
        if isinstance(layer, CodecLayer) and layer.evicted:
            positions = layer.positions()[0].cpu()  # (H, held)
            mask = torch.zeros(positions.shape[0], len(capture.token_ids), dtype=torch.bool)
            kept[index] = mask.scatter_(1, positions, True)
    return kept


def relative_error(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """||x̂ - x||_F / ||x||_F."""
    return float((x_hat - x).norm() / x.norm().clamp_min(1e-30))


def psnr_db(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """Peak signal-to-noise ratio in dB with peak = max|x|; inf when x̂ == x."""
    mse = float((x_hat - x).pow(2).mean())
    if mse == 0.0:
        return math.inf
    return 20 * math.log10(float(x.abs().max())) - 10 * math.log10(mse)


def mean_cosine(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """Mean cosine similarity of matching rows (tokens) of x, x̂ (..., D)."""
    return float(torch.nn.functional.cosine_similarity(x, x_hat, dim=-1, eps=1e-12).mean())


def attention_error(k: torch.Tensor, v: torch.Tensor, k_hat: torch.Tensor, v_hat: torch.Tensor) -> float:
    """Relative error of softmax(q Kᵀ/√d) V with q = the last token's original key, mean over heads. (H, S, D)."""
    q = k[:, -1:]  # (H, 1, D) stand-in query
    scale = 1.0 / math.sqrt(k.shape[-1])
    exact = torch.softmax(q @ k.transpose(1, 2) * scale, dim=-1) @ v  # (H, 1, Dv)
    approx = torch.softmax(q @ k_hat.transpose(1, 2) * scale, dim=-1) @ v_hat
    per_head = (approx - exact).norm(dim=(1, 2)) / exact.norm(dim=(1, 2)).clamp_min(1e-30)  # (H,)
    return float(per_head.mean())


def var_delta_ratio(x: torch.Tensor) -> float:
    """Var(Δx)/Var(x) along the sequence, Δ = first difference, summed over heads and channels. x: (H, S, D)."""
    if x.shape[1] < 3:
        return math.nan
    delta = x[:, 1:] - x[:, :-1]  # (H, S-1, D)
    return float(delta.var(dim=1).sum() / x.var(dim=1).sum().clamp_min(1e-30))
