"""vLLM's TurboQuant presets against vLLM's own kernels: the fixtures assets/vllm-reference/<model>.safetensors.

scripts/vllm_reference.py recorded them: a model's real post-RoPE keys and values (64 tokens of the Bible, two
layers), stored by vLLM 0.34.0's store kernel, read back by its full-dequant kernel and attended on by its decode
kernel, all under TRITON_INTERPRET=1 in vLLM's own virtualenv. Here:

- bytes: a token and head take vLLM's key_packed_size, value_packed_size and (even) slot size;
- what the project's encoders store for the same tensors is vLLM's slot, field by field: the value codes, scales
  and zeros exactly (elementwise float32 arithmetic, the same on any CPU). Key norms (a reduction) and key codes (a
  rotation, then midpoints) are byte for byte vLLM's on the machine that recorded them; on another CPU's rounding a
  norm may move one float16 step and a coordinate within 1e-5 of a midpoint one code, and nothing more is allowed.
  The FP8 keys of turboquant_k8v4 differ in two ways that are Triton's interpreter's, not vLLM's: it converts
  float32 to E4M3 by adding the cut-off bit to a truncated mantissa (triton/runtime/interpreter.py, `_convert_float`),
  so a rounding that carries into the exponent is lost (-7.84 -> -4 where a GPU's cvt.rn.satfinite and torch give
  -8), and below the smallest normal number it truncates (0.0033 -> 2**-9 where a GPU and torch give 2**-8); about 3%
  of the keys here, and no other difference is allowed;
- the project's decoders, reading vLLM's own slots: keys (in vLLM's rotated domain) and values equal vLLM's float16
  outputs to one float16 step (2**-10 relative: vLLM rounds what it decodes to float16, the project keeps float32),
  and attention over them vLLM's decode kernel's output to 1e-4 relative (both float32; the orders of summation
  differ: vLLM splits the keys into 32 parts and merges them);
- levels and matrix equal vLLM's exactly, and the layers kept native are get_boundary_skip_layers' for the model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from codeckv.cache.schedule import boundary_layers
from codeckv.codecs.base import Encoded
from codeckv.codecs.bitpack import unpack_bits
from codeckv.codecs.vllm_tq_keys import TQKeys, hadamard, levels, midpoints
from codeckv.tiers import TIERS

FIXTURES = Path(__file__).resolve().parents[2] / "assets" / "vllm-reference"
MODELS = sorted(path.stem for path in FIXTURES.glob("*.safetensors"))
PRESETS = {"turboquant_k8v4": "vllm-tq-k8v4", "turboquant_4bit_nc": "vllm-tq-4bit-nc",
           "turboquant_k3v4_nc": "vllm-tq-k3v4-nc", "turboquant_3bit_nc": "vllm-tq-3bit-nc"}
E4M3_SMALLEST_NORMAL, E4M3_STEP = 2.0**-6, 2.0**-9  # below the smallest normal, E4M3's values are steps of 2**-9
FP16_STEP = 2.0**-10  # one float16 step, relative: what vLLM's float16 outputs round away
MIDPOINT_NOISE = 1e-5  # a rotated coordinate this near a midpoint may fall either side on another CPU's rounding


def reference(model: str) -> tuple[dict[str, torch.Tensor], dict]:
    """The fixture's tensors and its metadata."""
    path = FIXTURES / f"{model}.safetensors"
    with open(path, "rb") as handle:
        header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))["__metadata__"]
    return load_file(path), json.loads(header["reference"])


def layers_of(tensors: dict[str, torch.Tensor]) -> list[int]:
    return sorted({int(name.split(".")[2]) for name in tensors if name.startswith("input.keys.")})


def coded(tier_name: str, keys: torch.Tensor, values: torch.Tensor):
    """The tier's codecs, fitted to the head_dim, and what they store for keys / values (N, Hk, D)."""
    tier = TIERS[tier_name].for_head_dims(keys.shape[-1], values.shape[-1])
    x, y = keys.transpose(0, 1)[None], values.transpose(0, 1)[None]  # (1, Hk, N, D)
    return tier, tier.key.encode(x), tier.value.encode(y)


def cases():
    for model in MODELS:
        tensors, _ = reference(model)
        for preset in PRESETS:
            for layer in layers_of(tensors):
                yield pytest.param(model, preset, layer, id=f"{model}-{preset}-layer{layer}")


def test_fixtures_exist_for_both_models():
    assert {"smollm2-135m", "qwen2.5-coder-0.5b"} <= set(MODELS), f"fixtures: {MODELS}"


def from_slots(tier, slots: torch.Tensor, head_dim: int):
    """vLLM's slots (N, Hk, slot bytes) cut into the tensors the tier's key and value codecs store: (Encoded, Encoded)
    of (1, Hk, N, head_dim) tokens."""
    tokens, heads, _ = slots.shape
    shape = (1, heads, tokens, head_dim)

    def tensors(parts: dict, start: int) -> tuple[dict, int]:
        out = {}
        for name, (width, dtype) in parts.items():
            raw = slots[..., start:start + width].contiguous().view(dtype)  # (N, Hk, width / itemsize)
            out[name], start = raw.transpose(0, 1)[None].contiguous(), start + width
        return out, start

    if isinstance(tier.key, TQKeys):
        keys, start = tensors({"codes": (head_dim * tier.key.bits // 8, torch.uint8), "norm": (2, torch.float16)}, 0)
    else:
        keys, start = tensors({"values": (head_dim, torch.float8_e4m3fn)}, 0)
    values, _ = tensors({"codes": (head_dim * tier.value.bits // 8, torch.uint8), "scale": (2, torch.float16),
                         "zero": (2, torch.float16)}, start)
    return Encoded(keys, shape, torch.float32), Encoded(values, shape, torch.float32)


@pytest.mark.parametrize("model, preset, layer", list(cases()))
def test_stored_bytes_are_vllms_slots(model, preset, layer):
    tensors, info = reference(model)
    keys, values = tensors[f"input.keys.{layer}"], tensors[f"input.values.{layer}"]
    tier, k, v = coded(PRESETS[preset], keys, values)
    sizes = info["presets"][preset]
    tokens, heads, head_dim = keys.shape
    assert tier.key.nbytes(k) == sizes["key_bytes"] * tokens * heads, f"{preset}: key bytes"
    assert tier.value.nbytes(v) == sizes["value_bytes"] * tokens * heads, f"{preset}: value bytes"
    assert sizes["key_bytes"] + sizes["value_bytes"] == sizes["slot_bytes"], f"{preset}: vLLM pads this slot"
    theirs_k, theirs_v = from_slots(tier, tensors[f"{preset}.{layer}.slots"], head_dim)
    for name in v.data:  # elementwise IEEE arithmetic on the same floats: exact on any CPU
        assert torch.equal(v.data[name], theirs_v.data[name]), f"{preset}: value {name} differs from vLLM's bytes"
    if "values" in k.data:  # FP8 keys: the interpreter's conversion is the only allowed difference (docstring)
        differ = k.data["values"].view(torch.uint8) != theirs_k.data["values"].view(torch.uint8)
        ours_fp8, theirs_fp8 = k.data["values"][differ].float(), theirs_k.data["values"][differ].float()
        lost_carry = (torch.frexp(ours_fp8.abs())[0] == 0.5) & (theirs_fp8 == ours_fp8 / 2)
        truncated = (ours_fp8.abs() <= E4M3_SMALLEST_NORMAL) & (ours_fp8.abs() - theirs_fp8.abs() == E4M3_STEP) \
            & (ours_fp8 * theirs_fp8 >= 0)
        assert (lost_carry | truncated).all(), f"{preset}: FP8 keys differ beyond the interpreter's conversion: " \
            f"ours {ours_fp8[~(lost_carry | truncated)]}, vLLM's {theirs_fp8[~(lost_carry | truncated)]}"
        return
    # Norms and codes come from a reduction and a matrix product, whose rounding moves with the CPU's vector width:
    # a norm may land one float16 step away, a coordinate on the other side of a level's midpoint (a code one apart).
    torch.testing.assert_close(k.data["norm"].float(), theirs_k.data["norm"].float(), rtol=FP16_STEP, atol=0,
                               msg=lambda m: f"{preset}: key norms differ from vLLM's by more than a float16 step\n{m}")
    ours_codes, their_codes = (unpack_bits(c.data["codes"], tier.key.bits) for c in (k, theirs_k))
    moved = ours_codes != their_codes
    x = keys.transpose(0, 1)[None]
    y = (x / (x.norm(dim=-1, keepdim=True) + 1e-8)) @ hadamard(head_dim)  # what was bucketized
    edge = (y[..., None] - midpoints(head_dim, tier.key.bits)).abs().amin(-1)
    assert ((ours_codes - their_codes).abs()[moved] == 1).all() and (edge[moved] < MIDPOINT_NOISE).all(), \
        f"{preset}: {int(moved.sum())} key codes differ from vLLM's away from a midpoint"
    assert moved.float().mean() <= 1e-3, f"{preset}: {int(moved.sum())} of {moved.numel()} key codes differ"


@pytest.mark.parametrize("model, preset, layer", list(cases()))
def test_decoded_keys_values_and_attention_are_vllms(model, preset, layer):
    """The project's decoders read vLLM's own slots and give what vLLM's dequant and decode-attention kernels give."""
    tensors, _ = reference(model)
    keys = tensors[f"input.keys.{layer}"]
    head_dim = keys.shape[-1]
    tier = TIERS[PRESETS[preset]].for_head_dims(head_dim, head_dim)
    k, v = from_slots(tier, tensors[f"{preset}.{layer}.slots"], head_dim)
    decoded_k, decoded_v = tier.key.decode(k)[0].transpose(0, 1), tier.value.decode(v)[0].transpose(0, 1)  # (N, Hk, D)
    torch.testing.assert_close(decoded_v, tensors[f"{preset}.{layer}.values"].float(), rtol=FP16_STEP, atol=2.0**-14,
                               msg=lambda m: f"{model} {preset} layer {layer}: values differ from vLLM's\n{m}")
    rotated = decoded_k @ hadamard(head_dim) if isinstance(tier.key, TQKeys) else decoded_k  # vLLM's domain
    torch.testing.assert_close(rotated, tensors[f"{preset}.{layer}.keys_rotated"].float(), rtol=FP16_STEP,
                               atol=2.0**-14, msg=lambda m: f"{model} {preset} layer {layer}: keys differ\n{m}")
    query = tensors[f"input.query.{layer}"]  # (Hq, D): the last token's
    group = query.shape[0] // keys.shape[1]
    kk = decoded_k.transpose(0, 1).repeat_interleave(group, 0)  # (Hq, N, D)
    vv = decoded_v.transpose(0, 1).repeat_interleave(group, 0)
    ours = torch.nn.functional.scaled_dot_product_attention(query[:, None], kk, vv)[:, 0]  # (Hq, D)
    torch.testing.assert_close(ours, tensors[f"{preset}.{layer}.attention"], rtol=1e-4, atol=1e-5,
                               msg=lambda m: f"{model} {preset} layer {layer}: attention differs from vLLM's\n{m}")


@pytest.mark.parametrize("model", MODELS)
def test_levels_matrix_and_boundary_layers_are_vllms(model):
    tensors, info = reference(model)
    head_dim = tensors[f"input.keys.{layers_of(tensors)[0]}"].shape[-1]
    assert torch.equal(hadamard(head_dim), tensors["hadamard"]), "the rotation is not vLLM's Sylvester matrix"
    for preset, name in PRESETS.items():
        bits = info["presets"][preset]["key_quant_bits"]
        if bits != 8:
            assert torch.equal(levels(head_dim, bits), tensors[f"{preset}.centroids"]), f"{preset}: levels differ"
        dense = ["full_attention"] * info["model_layers"]
        assert boundary_layers(TIERS[name], dense) == info["boundary_layers"], f"{model} {preset}: boundary layers"
