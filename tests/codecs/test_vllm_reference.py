"""vLLM's TurboQuant presets against vLLM's own kernels: the fixtures assets/vllm-reference/<model>.safetensors.

scripts/vllm_reference.py recorded them: a model's real post-RoPE keys and values (64 tokens of the Bible, two
layers), stored by vLLM 0.34.0's store kernel, read back by its full-dequant kernel and attended on by its decode
kernel, all under TRITON_INTERPRET=1 in vLLM's own virtualenv. Here the project's tiers code the same tensors:

- bytes: a token and head take vLLM's key_packed_size, value_packed_size and (even) slot size;
- stored bytes: laid out as vLLM's slot ([key codes | fp16 norm | value codes | fp16 scale | fp16 zero]), the
  project's tensors are vLLM's byte for byte. One exception, not vLLM's: Triton's interpreter converts float32 to
  FP8 E4M3 by adding the cut-off bit to a truncated mantissa (triton/runtime/interpreter.py, `_convert_float`), so a
  value whose rounding carries into the exponent loses the carry (-7.84 -> -4 where a GPU's cvt.rn.satfinite and
  torch give -8), and below the smallest normal number it shifts the rounded mantissa right, truncating (0.0033 ->
  2**-9 where a GPU and torch give 2**-8). The FP8 keys of turboquant_k8v4 may differ in these two ways, and in no
  other (about 3% of the keys here);
- decoded: keys (in vLLM's rotated domain) and values equal vLLM's float16 outputs to one float16 step (2**-10
  relative: vLLM rounds what it decodes to float16, the project keeps float32), and 2**-14 absolute near zero;
- attention: attention over the decoded keys and values gives vLLM's decode kernel's output to 1e-4 relative (both
  float32; the orders of summation differ: vLLM splits the keys into 32 parts and merges them);
- levels and matrix equal vLLM's exactly, and the layers kept native are get_boundary_skip_layers' for the model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from codeckv.cache.schedule import boundary_layers
from codeckv.codecs.vllm_tq_keys import hadamard, levels
from codeckv.tiers import TIERS

FIXTURES = Path(__file__).resolve().parents[2] / "assets" / "vllm-reference"
MODELS = sorted(path.stem for path in FIXTURES.glob("*.safetensors"))
PRESETS = {"turboquant_k8v4": "vllm-tq-k8v4", "turboquant_4bit_nc": "vllm-tq-4bit-nc",
           "turboquant_k3v4_nc": "vllm-tq-k3v4-nc", "turboquant_3bit_nc": "vllm-tq-3bit-nc"}
E4M3_SMALLEST_NORMAL, E4M3_STEP = 2.0**-6, 2.0**-9  # below the smallest normal, E4M3's values are steps of 2**-9
FP16_STEP = 2.0**-10  # one float16 step, relative: what vLLM's float16 outputs round away


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


def as_slots(*parts: torch.Tensor) -> torch.Tensor:
    """(1, Hk, N, n_i) stored tensors side by side as bytes, in vLLM's order: (N, Hk, slot bytes) uint8."""
    return torch.cat([p[0].transpose(0, 1).contiguous().view(torch.uint8) for p in parts], dim=-1)


def cases():
    for model in MODELS:
        tensors, _ = reference(model)
        for preset in PRESETS:
            for layer in layers_of(tensors):
                yield pytest.param(model, preset, layer, id=f"{model}-{preset}-layer{layer}")


def test_fixtures_exist_for_both_models():
    assert {"smollm2-135m", "qwen2.5-coder-0.5b"} <= set(MODELS), f"fixtures: {MODELS}"


@pytest.mark.parametrize("model, preset, layer", list(cases()))
def test_stored_bytes_are_vllms_slots(model, preset, layer):
    tensors, info = reference(model)
    keys, values = tensors[f"input.keys.{layer}"], tensors[f"input.values.{layer}"]
    tier, k, v = coded(PRESETS[preset], keys, values)
    sizes = info["presets"][preset]
    tokens, heads = keys.shape[:2]
    assert tier.key.nbytes(k) == sizes["key_bytes"] * tokens * heads, f"{preset}: key bytes"
    assert tier.value.nbytes(v) == sizes["value_bytes"] * tokens * heads, f"{preset}: value bytes"
    assert sizes["key_bytes"] + sizes["value_bytes"] == sizes["slot_bytes"], f"{preset}: vLLM pads this slot"
    theirs = tensors[f"{preset}.{layer}.slots"]
    key_parts = [k.data["values"]] if "values" in k.data else [k.data["codes"], k.data["norm"]]
    ours = as_slots(*key_parts, v.data["codes"], v.data["scale"], v.data["zero"])
    assert ours.shape == theirs.shape, f"{preset}: slot {tuple(ours.shape)} vs vLLM's {tuple(theirs.shape)}"
    differ = ours != theirs
    if "values" in k.data:  # FP8 keys: the interpreter's lost carry is the only allowed difference (docstring)
        key_bytes = sizes["key_bytes"]
        assert not differ[..., key_bytes:].any(), f"{preset}: value bytes differ at {differ[..., key_bytes:].sum()}"
        ours_fp8 = ours[..., :key_bytes][differ[..., :key_bytes]].view(torch.float8_e4m3fn).float()
        theirs_fp8 = theirs[..., :key_bytes][differ[..., :key_bytes]].view(torch.float8_e4m3fn).float()
        lost_carry = (torch.frexp(ours_fp8.abs())[0] == 0.5) & (theirs_fp8 == ours_fp8 / 2)
        truncated = (ours_fp8.abs() <= E4M3_SMALLEST_NORMAL) & (ours_fp8.abs() - theirs_fp8.abs() == E4M3_STEP) \
            & (ours_fp8 * theirs_fp8 >= 0)
        assert (lost_carry | truncated).all(), f"{preset}: FP8 keys differ beyond the interpreter's conversion: " \
            f"ours {ours_fp8[~(lost_carry | truncated)]}, vLLM's {theirs_fp8[~(lost_carry | truncated)]}"
    else:
        assert not differ.any(), f"{preset}: {int(differ.sum())} of {differ.numel()} bytes differ from vLLM's slots"


@pytest.mark.parametrize("model, preset, layer", list(cases()))
def test_decoded_keys_values_and_attention_are_vllms(model, preset, layer):
    tensors, _ = reference(model)
    keys, values = tensors[f"input.keys.{layer}"], tensors[f"input.values.{layer}"]
    tier, k, v = coded(PRESETS[preset], keys, values)
    decoded_k, decoded_v = tier.key.decode(k)[0].transpose(0, 1), tier.value.decode(v)[0].transpose(0, 1)  # (N, Hk, D)
    torch.testing.assert_close(decoded_v, tensors[f"{preset}.{layer}.values"].float(), rtol=FP16_STEP, atol=2.0**-14,
                               msg=lambda m: f"{model} {preset} layer {layer}: values differ from vLLM's\n{m}")
    if "values" in k.data:
        return  # FP8 keys: the bytes are the check (test_stored_bytes_are_vllms_slots); vLLM's decode read the
        # interpreter's conversion, not the hardware's
    rotated = decoded_k @ hadamard(keys.shape[-1])
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
