"""Which transformers model families each tier runs on: a tiny random-weight model per family, every tier, on a
decoded view and on the stored codes.

    results = check_family("gemma2", [TIERS["png"], TIERS["turbo-4"]])   # FamilyResult per tier and mode
    python -m codeckv families                                            # the matrix: every family, every tier

A family's tiny model (FAMILIES: its model_type and the config fields that make it small and exercise its cache:
a sliding window shorter than the prompt, a hybrid's attention layers among its linear ones, MLA's latent) has
random weights, so its tokens mean nothing in themselves. What is checked is that a cache runs as the model's own:
native through codeckv's attention gives the tokens of the model's own attention (SDPA, or eager where it
softcaps), png (lossless) gives native's greedy tokens exactly, and every other tier runs on a decoded view and on
the codes (materialization_free False and True), or is refused when the cache is made, with the reason. PCA tiers
are calibrated on the tiny model itself (calibrate_specs: a few windows of random tokens, one pass for all).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.cache_utils import get_layer_types_and_kwargs

from codeckv.cache import make_cache
from codeckv.cache.attention import use_codec_attention
from codeckv.cache.calibration import Calibration
from codeckv.cache.calibration_fit import fit_basis, fit_coders
from codeckv.cache.kv_scales import KVScales, kv_absmax, needs_scales
from codeckv.tiers import Tier

TINY = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 96, "vocab_size": 160, "max_position_embeddings": 512, "head_dim": 32,
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
MOE = {"num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
       "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32}
WINDOW = 40  # the sliding window of the tiny sliding-window models: shorter than PROMPT, longer than a unit
MLA = {"q_lora_rank": 32, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
       "num_key_value_heads": 4, "head_dim": None, "n_group": 1, "topk_group": 1}
MAMBA2 = {"mamba_d_head": 32, "mamba_n_heads": 8, "mamba_d_state": 16}  # the defaults' state of 256 is not tiny
LINEAR = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
          "linear_value_head_dim": 32}  # Qwen3-Next's gated delta-net layers at 16 x 128 keys otherwise

# family -> the config fields it needs beyond TINY (None removes a TINY field the family does not take)
FAMILIES: dict[str, dict] = {
    "llama": {}, "mistral": {"sliding_window": WINDOW}, "mixtral": {"sliding_window": None}, "qwen2": {},
    "qwen2_moe": {}, "qwen3": {}, "qwen3_moe": {}, "qwen3_next": LINEAR, "phi": {}, "phi3": {}, "gemma": {},
    "gemma2": {"sliding_window": WINDOW}, "gemma3_text": {"sliding_window": WINDOW, "layer_types": None},
    "cohere": {}, "cohere2": {"sliding_window": WINDOW}, "olmo2": {}, "olmo3": {"sliding_window": WINDOW},
    "granite": {}, "gpt_neox": {}, "stablelm": {}, "gpt2": {}, "starcoder2": {"sliding_window": None},
    "deepseek_v2": MLA, "deepseek_v3": MLA, "minicpm3": MLA, "falcon": {},
    "falcon_h1": {"mamba_d_ssm": 64, "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 16},
    "gpt_oss": {"sliding_window": WINDOW}, "smollm3": {}, "glm4": {}, "exaone4": {"sliding_window": WINDOW},
    "llama4_text": {"attention_chunk_size": WINDOW}, "bloom": {}, "opt": {"ffn_dim": 96}, "gptj": {"rotary_dim": 16},
    "gpt_bigcode": {}, "mpt": {}, "internlm3": {}, "helium": {}, "persimmon": {}, "lfm2": {},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1,
              "mamba_dt_rank": 8},
    "bamba": {"attn_layer_indices": [1, 3], **MAMBA2},
    "granitemoehybrid": {"layer_types": ["mamba", "attention", "mamba", "attention"], **MAMBA2},
    "recurrent_gemma": {"attention_window_size": WINDOW, "block_types": ["recurrent", "attention"]},
}
PROMPT, NEW = 72, 10  # tokens prompted and generated: past a window, several archive units


@dataclass
class FamilyResult:
    """One tier on one family's tiny model, on one path."""

    family: str
    tier: str
    mode: str  # "view" (materialization_free=False) or "codes" (True)
    outcome: str  # "same tokens" (as native), "runs", "refused" (when the cache was made) or "failed"
    detail: str  # the ratio it stored, or the reason it was refused / failed
    seconds: float


def tiny_config(family: str):
    """The family's tiny config (module docstring): TINY's fields that the family has, then its own."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r} (allowed: {', '.join(FAMILIES)})")
    defaults = AutoConfig.for_model(family)
    known = set(defaults.to_dict()) | set(getattr(type(defaults), "attribute_map", {}))
    fields = {k: v for k, v in {**TINY, **MOE}.items() if k in known}
    if "layer_types" in defaults.to_dict() and "layer_types" not in getattr(type(defaults), "attribute_map", {}):
        fields["layer_types"] = None  # derived from the layer count (and the family's own pattern)
    fields.update(FAMILIES[family])
    return AutoConfig.for_model(family, **{k: v for k, v in fields.items() if v is not None or k == "layer_types"})


def tiny_model(family: str, attn_implementation: str | None = None):
    """The family's tiny random-weight model (seeded), in fp32 on the CPU."""
    torch.manual_seed(0)
    config = tiny_config(family)
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    return AutoModelForCausalLM.from_config(config).eval()


def calibrate_specs(model, tiers: list[Tier], windows: int = 2, length: int = 48) -> list[Calibration | KVScales]:
    """Every PCA tier's Calibration on `model` from `windows` windows of random tokens, one basis for all (none for a
    model without a full-attention layer: the PCA tiers code none of its layers, which make_cache says), and the
    model's FP8 scales where a tier takes them."""
    specs = list(dict.fromkeys(t.joint for t in tiers if t.joint is not None))
    kinds, _ = get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))
    vocab = model.config.get_text_config(decoder=True).vocab_size
    ids = torch.randint(3, vocab, (windows, length), generator=torch.Generator().manual_seed(1))
    scales = [KVScales("tiny", kv_absmax(model, ids))] if any(needs_scales(t) for t in tiers) else []
    if not specs or "full_attention" not in kinds:
        return scales
    with torch.inference_mode(False):
        basis, rows = fit_basis(model, ids)
        ys = basis.project(rows)
        fits = [fit_coders(basis, ys, spec) for spec in specs]
    return scales + [Calibration("tiny", spec, fit.coders, fit.step, fit.bits_per_element, 0.0)
                     for spec, fit in zip(specs, fits)]


def _greedy(model, ids: torch.Tensor, cache) -> torch.Tensor:
    out = model.generate(ids, cache=cache, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
    return out[:, ids.shape[1] :]


def check_family(family: str, tiers: list[Tier]) -> list[FamilyResult]:
    """Every tier of `tiers` on the family's tiny model, view and codes (module docstring), native first."""
    model = tiny_model(family)
    use_codec_attention(model)
    calibrations = calibrate_specs(model, tiers)  # outside inference mode: a calibration needs autograd
    with torch.inference_mode():
        return _check(family, model, tiers, calibrations)


def _check(family: str, model, tiers: list[Tier], calibrations: list[Calibration]) -> list[FamilyResult]:
    own = tiny_model(family)  # the model's own attention
    ids = torch.randint(3, own.config.get_text_config(decoder=True).vocab_size, (1, PROMPT),
                        generator=torch.Generator().manual_seed(2))
    own_tokens = _greedy(own, ids, make_cache(own.config, "native"))
    start = time.perf_counter()
    native = _greedy(model, ids, make_cache(model.config, "native"))
    routed = model.config._attn_implementation == "codeckv"
    results = [FamilyResult(family, "native", "view", "same tokens" if torch.equal(native, own_tokens) else "failed",
                            "through codeckv's attention" if routed else "the model's own attention (not routable)",
                            time.perf_counter() - start)]
    for tier in tiers:
        if tier.is_native:
            continue
        for mode, free in (("view", False), ("codes", True)):
            start = time.perf_counter()
            try:
                cache = make_cache(model.config, tier, materialization_free=free, calibration=calibrations)
            except ValueError as err:
                results.append(FamilyResult(family, tier.name, mode, "refused", str(err), time.perf_counter() - start))
                continue
            try:
                tokens = _greedy(model, ids, cache)
                ratio = cache.footprint().ratio
                if not math.isfinite(ratio) or ratio <= 0:
                    raise ValueError(f"footprint ratio {ratio}")
            except Exception as err:  # noqa: BLE001 - any error is this family's failure, reported as a result
                results.append(FamilyResult(family, tier.name, mode, "failed", f"{type(err).__name__}: {err}",
                                            time.perf_counter() - start))
                continue
            same = torch.equal(tokens, native)
            outcome = "same tokens" if same else "runs"
            results.append(FamilyResult(family, tier.name, mode, outcome, f"ratio {ratio:.3f}",
                                        time.perf_counter() - start))
    return results
