"""Record what vLLM's own TurboQuant kernels store and decode, as the fixture tests/codecs/test_vllm_reference.py reads.

    .venv/bin/python scripts/vllm_reference.py                                 # SmolLM2-135M
    .venv/bin/python scripts/vllm_reference.py --model qwen2.5-coder-0.5b

vLLM pins its own torch, transformers and a CUDA stack, so its kernels run in a virtualenv of their own
($CODECKV_CACHE/vllm-<version>-venv, built here once from the package registry: torch as this project pins it,
triton, vllm --no-deps with the few packages its kernel modules import), under TRITON_INTERPRET=1 on the CPU, with
CUDA_VISIBLE_DEVICES empty (vLLM then keeps Triton with no GPU driver; vllm/triton_utils/importing.py). This script,
in the project's environment, loads the model, prefills a text natively, and writes the post-RoPE keys and values
of a few layers and the last token's queries; scripts/vllm_worker.py, in vLLM's environment, stores them with
each preset, reads them back and attends on them. The fixture is assets/vllm-reference/<model>.safetensors: the
inputs, vLLM's slots, dequantized keys (rotated) and values (float16), attention outputs, levels and matrix, and in
its metadata vLLM's slot sizes and the boundary layers it keeps native for this model.

When vLLM releases: pass --vllm NEW_VERSION, run it for both models, run the test, commit the fixtures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from codeckv.cache.attention import captured_queries  # noqa: E402
from codeckv.corpus import bible_text  # noqa: E402
from codeckv.models import load_model  # noqa: E402
from scripts.reference_venv import reference_venv  # noqa: E402

FIXTURES = REPO / "assets" / "vllm-reference"
TOKENS = 64  # tokens of each layer's keys and values recorded: four of vLLM's 16-token pages
# What vllm's TurboQuant kernel modules and its attention backend import, beyond torch and triton (found by importing
# them in a bare virtualenv, one missing module at a time); vllm itself goes in --no-deps.
VLLM_IMPORTS = ["numpy", "packaging", "regex", "psutil", "pyzmq", "urllib3", "aiohttp", "requests", "pillow",
                "pybase64", "cachetools", "cbor2", "msgspec", "cloudpickle", "uvloop", "py-cpuinfo",
                "prometheus_client", "llguidance", "xgrammar", "safetensors"]


def vllm_venv(vllm: str, transformers: str, torch_version: str) -> Path:
    """The python of a virtualenv holding vllm==vllm's kernels beside torch==torch_version (built once)."""
    return reference_venv(f"vllm-{vllm}", [[f"torch=={torch_version}", "triton", f"transformers=={transformers}",
                                            *VLLM_IMPORTS], ["--no-deps", f"vllm=={vllm}"]])


def record_inputs(model: str, layers: list[int] | None) -> dict[str, torch.Tensor]:
    """The model's keys and values (N, Hk, D) of `layers` after TOKENS tokens of the Bible, and the last token's
    queries (Hq, D), float32; `model_layers` its layer count."""
    loaded = load_model(model)
    config = loaded.model.config.get_text_config(decoder=True)
    count = config.num_hidden_layers
    layers = layers or [1, count // 2]
    ids = loaded.tokenizer(bible_text(), return_tensors="pt").input_ids[:, :TOKENS]
    cache = DynamicCache(config=loaded.model.config)
    with torch.inference_mode(), captured_queries() as queries:
        loaded.model(ids, cache=cache)
    inputs = {"model_layers": torch.tensor(count)}
    for layer in layers:
        cached = cache.layers[layer]
        inputs[f"keys.{layer}"] = cached.keys[0].transpose(0, 1).float().contiguous()  # (N, Hk, D)
        inputs[f"values.{layer}"] = cached.values[0].transpose(0, 1).float().contiguous()
        inputs[f"query.{layer}"] = queries[layer][0, :, -1].float().contiguous()  # (Hq, D)
    return inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--layers", type=int, nargs="*", default=None, help="default: layer 1 and the middle one")
    parser.add_argument("--vllm", default="0.34.0")
    parser.add_argument("--transformers", default="5.22.0", help="what vLLM's tokenizer modules import (< 5.23)")
    args = parser.parse_args()
    python = vllm_venv(args.vllm, args.transformers, torch.__version__.split("+")[0])
    inputs = record_inputs(args.model, args.layers)
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "inputs.safetensors", Path(tmp) / "vllm.safetensors"
        save_file(inputs, source)
        start = time.perf_counter()
        env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
        subprocess.run([str(python), str(REPO / "scripts" / "vllm_worker.py"), str(source), str(target)], check=True,
                       env=env)
        with open(target, "rb") as handle:
            header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))["__metadata__"]
        outputs = load_file(target)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    path = FIXTURES / f"{args.model}.safetensors"
    info = {**json.loads(header["reference"]), "model": args.model, "text": "bible", "tokens": TOKENS}
    save_file({**{f"input.{k}": v for k, v in inputs.items()}, **outputs}, path,
              metadata={"reference": json.dumps(info)})
    print(f"wrote {path} ({path.stat().st_size:,} bytes) in {time.perf_counter() - start:.0f} s of vLLM's kernels")


if __name__ == "__main__":
    main()
