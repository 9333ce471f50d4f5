"""vLLM's side of the TurboQuant reference: run in vLLM's own virtualenv, under TRITON_INTERPRET=1 (no GPU).

    TRITON_INTERPRET=1 <vllm venv>/bin/python scripts/vllm_worker.py INPUT.safetensors OUTPUT.safetensors

scripts/vllm_reference.py writes INPUT (a model's real post-RoPE keys, values and queries of a few layers, and the
model's layer count) and reads OUTPUT back. For every TurboQuant preset and layer this stores the keys and values
with vLLM's own store kernel (`triton_turboquant_store`) into a paged uint8 cache of vLLM's slot size, reads them
back with its full-dequant kernel (`_tq_full_dequant_kv`: keys in the rotated domain and values, float16) and
attends with its decode kernel (`triton_turboquant_decode_attention`) for the last query; the matrix, levels and
midpoints are the attention backend's (`_build_hadamard`, `get_centroids`, as `_ensure_on_device` derives them) and
the layers a dense model keeps native are `TurboQuantConfig.get_boundary_skip_layers`'s. Nothing of this project
is imported here.
"""

from __future__ import annotations

import json
import math
import sys
from importlib.metadata import version
from types import SimpleNamespace

import torch
from safetensors.torch import load_file, save_file
from vllm.model_executor.layers.quantization.turboquant.centroids import get_centroids
from vllm.model_executor.layers.quantization.turboquant.config import TQ_PRESETS, TurboQuantConfig
from vllm.v1.attention.backends.turboquant_attn import _build_hadamard
from vllm.v1.attention.ops.triton_turboquant_decode import _tq_full_dequant_kv, triton_turboquant_decode_attention
from vllm.v1.attention.ops.triton_turboquant_store import triton_turboquant_store

BLOCK_SIZE = 16  # tokens a page of vLLM's paged cache


def run_preset(preset: str, keys: torch.Tensor, values: torch.Tensor, query: torch.Tensor) -> dict[str, torch.Tensor]:
    """vLLM's slots, dequantized keys (rotated) and values, and decode attention for keys/values (N, Hk, D)."""
    n, hk, d = keys.shape
    config = TurboQuantConfig.from_cache_dtype(preset, d)
    hadamard = _build_hadamard(d, "cpu")
    centroids = get_centroids(d, config.centroid_bits).float()
    ordered = centroids.sort().values
    midpoints = (ordered[:-1] + ordered[1:]) / 2
    pages = math.ceil(n / BLOCK_SIZE)
    cache = torch.zeros(pages, BLOCK_SIZE, hk, config.slot_size_aligned, dtype=torch.uint8)
    triton_turboquant_store(keys, values, cache, torch.arange(n, dtype=torch.int32), hadamard, midpoints,
                            mse_bits=config.key_mse_bits, key_packed_size=config.key_packed_size,
                            value_quant_bits=config.effective_value_quant_bits, key_fp8=config.key_fp8)
    table = torch.arange(pages, dtype=torch.int32)[None, :]  # (1, pages)
    k_out = torch.zeros(1, hk, pages * BLOCK_SIZE, d, dtype=torch.float16)
    v_out = torch.zeros_like(k_out)
    _tq_full_dequant_kv[(n, hk)](
        cache, table, centroids, k_out, v_out, k_out.stride(0), k_out.stride(1), k_out.stride(2), v_out.stride(0),
        v_out.stride(1), v_out.stride(2), cache.stride(0), cache.stride(1), cache.stride(2), table.stride(0),
        HEAD_DIM=d, BLOCK_SIZE=BLOCK_SIZE, NUM_KV_HEADS=hk, MSE_BYTES=math.ceil(d * config.key_mse_bits / 8),
        KPS=config.key_packed_size, VQB=config.effective_value_quant_bits,
        VAL_DATA_BYTES=math.ceil(d * config.effective_value_quant_bits / 8), MSE_BITS=config.key_mse_bits,
        KEY_FP8=1 if config.key_fp8 else 0, BLOCK_D=triton_next_pow2(d),
        NORM_CORRECTION=1 if config.norm_correction else 0, FP8_E4B15=0)
    attended = triton_turboquant_decode_attention(
        query[None], cache, table, torch.tensor([n], dtype=torch.int32), hadamard, centroids, 1 / math.sqrt(d),
        mse_bits=config.key_mse_bits, key_packed_size=config.key_packed_size,
        value_quant_bits=config.effective_value_quant_bits, key_fp8=config.key_fp8,
        norm_correction=config.norm_correction, PiT=hadamard)
    slots = cache.reshape(pages * BLOCK_SIZE, hk, -1)[:n]  # (N, Hk, slot bytes)
    return {"slots": slots.contiguous(), "keys_rotated": k_out[0, :, :n].transpose(0, 1).contiguous(),
            "values": v_out[0, :, :n].transpose(0, 1).contiguous(), "attention": attended[0].contiguous(),
            "centroids": centroids, "hadamard": hadamard.contiguous()}


def triton_next_pow2(n: int) -> int:
    """The smallest power of two >= n (the kernels' BLOCK_D)."""
    return 1 << (n - 1).bit_length()


def boundary(layers: int) -> list[int]:
    """vLLM's boundary layers of a dense model of `layers` layers."""
    model_config = SimpleNamespace(is_hybrid=False, hf_text_config=SimpleNamespace(num_hidden_layers=layers))
    return [int(i) for i in TurboQuantConfig.get_boundary_skip_layers(model_config)]


def main(source: str, target: str) -> None:
    inputs = load_file(source)
    layers = sorted({int(name.split(".")[1]) for name in inputs if name.startswith("keys.")})
    out, meta = {}, {}
    for preset in TQ_PRESETS:
        for layer in layers:
            result = run_preset(preset, inputs[f"keys.{layer}"], inputs[f"values.{layer}"], inputs[f"query.{layer}"])
            out[f"{preset}.centroids"] = result.pop("centroids").clone()
            out["hadamard"] = result.pop("hadamard").clone()
            out.update({f"{preset}.{layer}.{name}": t for name, t in result.items()})
        config = TurboQuantConfig.from_cache_dtype(preset, inputs[f"keys.{layers[0]}"].shape[-1])
        meta[preset] = {"slot_bytes": config.slot_size_aligned, "key_bytes": config.key_packed_size,
                        "value_bytes": config.value_packed_size, **TQ_PRESETS[preset]}
        print(f"{preset}: {len(layers)} layers, slot {config.slot_size_aligned} bytes", flush=True)
    model_layers = int(inputs["model_layers"].item())
    info = {"vllm": version("vllm"), "triton": version("triton"), "torch": torch.__version__, "presets": meta,
            "boundary_layers": boundary(model_layers), "model_layers": model_layers}
    save_file(out, target, metadata={"reference": json.dumps(info)})


if __name__ == "__main__":
    main(*sys.argv[1:3])
