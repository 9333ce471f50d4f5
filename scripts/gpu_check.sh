#!/usr/bin/env bash
# The GPU check in one command. It has not run on a GPU yet (none was available); --dry-run runs on CPU and
# tests/kernels/test_gpu_check.py checks the script without running it.
#   scripts/gpu_check.sh             on a CUDA machine: set up, the Triton kernel tests on the GPU, the kernels'
#                                    registers and spills as compiled (kernels.compile_check) and as the driver loaded
#                                    them (kernels.device_check), kernels.bench up to 64k with its roofline columns,
#                                    prefill timing and a short bf16 side-by-side on the embedded model; every CSV goes
#                                    under assets/ with the GPU's name, e.g. assets/kernels-bench-nvidia-h200.csv
#   scripts/gpu_check.sh --dry-run   the same steps, small, on CPU (Triton through its interpreter; the compile check
#                                    on a subset; no device check): checks the script; CSVs under out/gpu-check-dry/
# Environment: PYTHON=/path/to/python runs with that interpreter instead of scripts/setup.sh's .venv (a machine without
# network that already has the requirements). Each step has a time limit, generous for a cold machine's first Triton
# compilations (at most 26 minutes in all after set-up, a few on a warm one); a failing step is reported and the next
# one still runs; the exit status is 1 if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

dry=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry=1 ;;
    *) echo "gpu_check.sh: unknown flag '$arg' (allowed: --dry-run)" >&2; exit 2 ;;
  esac
done

if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
else
  scripts/setup.sh || { echo "gpu_check.sh: scripts/setup.sh failed" >&2; exit 1; }
  PY=.venv/bin/python
fi
if ! "$PY" -c "import pytest" 2>/dev/null; then  # the kernel tests need pytest only (not setup.sh --dev's browser)
  "$PY" -m pip install --disable-pip-version-check -q pytest || { echo "gpu_check.sh: cannot install pytest" >&2; exit 1; }
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

if [ "$dry" = 1 ]; then
  export TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES=""
  out=out/gpu-check-dry
  label=cpu-dry-run
  tests=(tests/kernels/test_rotate_quant.py tests/kernels/test_decode_attention.py -k "turbo-4 and one-row")
  bench=(--lengths 1024 --reps 2)
  compile=(--tiers turbo-4 --head-dims 64 --query-rows 1 --dtypes bfloat16 --archs 90)
  prefill=(--tokens 128 --reps 1 --tiers turbo-4 jpeg-k8-int8)
  latency=(--context 128 --tokens 4 --tiers turbo-4)
  memory=(--contexts 128 --new-tokens 4 --tiers turbo-4)
else
  if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check.sh: torch sees no CUDA device here (on CPU: scripts/gpu_check.sh --dry-run)" >&2
    exit 1
  fi
  export TRITON_INTERPRET=0
  out=assets
  label=$("$PY" -c "from kernels.bench import device_label; print(device_label())")
  tests=(tests/kernels)
  bench=(--lengths "1024,4096,16384,65536" --reps 20)
  compile=()
  prefill=(--tokens 1024 4096 --reps 3)
  latency=(--context 1024 --tokens 64 --tiers turbo-4)
  memory=(--contexts 1024 4096 8192 --new-tokens 64 --tiers turbo-4 pca-8x)
fi
mkdir -p "$out"

failed=()
started=$(date +%s)
step() {  # step NAME SECONDS COMMAND...: run with a time limit, report its time, remember a failure
  local name=$1 limit=$2 t0 rc
  shift 2
  echo
  echo "== $(date +%T) $name (limit ${limit}s)"
  t0=$(date +%s)
  timeout --signal=INT --kill-after=20 "$limit" "$@"
  rc=$?
  echo "== $name: exit $rc after $(( $(date +%s) - t0 ))s"
  [ "$rc" = 0 ] || failed+=("$name (exit $rc)")
}

step "environment" 60 "$PY" -c "
import torch, triton, transformers
print('torch', torch.__version__, 'cuda', torch.version.cuda, '| triton', triton.__version__,
      '| transformers', transformers.__version__)
print('device:', torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
command -v nvidia-smi >/dev/null && [ "$dry" = 0 ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv

step "kernel tests, TRITON_INTERPRET=$TRITON_INTERPRET" 420 \
  "$PY" -m pytest -q -p no:cacheprovider "${tests[@]}"
step "compile check: registers, spills, occupancy for sm_80 and sm_90" 300 \
  env TRITON_INTERPRET=0 "$PY" -m kernels.compile_check "${compile[@]}" --out "$out/kernels-resources-$label.csv"
if [ "$dry" = 0 ]; then
  step "device check: the driver's registers and spills against the compile check's" 180 \
    "$PY" -m kernels.device_check --out "$out/kernels-resources-check-$label.csv"
fi
step "kernels.bench" 180 \
  "$PY" -m kernels.bench "${bench[@]}" --out "$out/kernels-bench-$label.csv"
step "prefill + archiving vs native" 90 \
  "$PY" -m codeckv prefill "${prefill[@]}" --out "$out/prefill-smollm2-135m-$label.csv"
step "side by side: native vs turbo-4, with and without a view" 60 \
  "$PY" -m codeckv latency "${latency[@]}" --out "$out/latency-smollm2-135m-$label.csv"
step "memory: held, peak, at rest, the allocator's peak per turn" 240 \
  "$PY" -m codeckv memory "${memory[@]}" --out "$out/memory-smollm2-135m-$label.csv" --charts "out/memory-$label"

echo
echo "gpu_check.sh: $(( $(date +%s) - started ))s after set-up; CSVs:"
for csv in "$out"/*-"$label".csv; do
  [ -e "$csv" ] && echo "  $csv"
done
if [ "${#failed[@]}" -gt 0 ]; then
  printf 'gpu_check.sh: failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "gpu_check.sh: all steps passed"
