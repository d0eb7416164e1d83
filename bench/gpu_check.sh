#!/usr/bin/env bash
# The CUDA check (issue 23): on a GPU machine, the trainer's tests on the device and a
# 2-minute training run of the built-in tiny model (a Hugging Face Llama-shaped directory)
# with the trainer on CUDA. Prepare here first (bench/gpu_prepare.sh), then run it there
# from the repository root with .whl and .gpu carried. It writes env.txt, tests.txt,
# train.txt, metrics.jsonl and the evaluations to $OUT (default /tmp/gpu-check).
#
# Not in it: vLLM rollouts (its wheel is far larger than what a device call carries, and the
# GPU machine reaches no index), so rollouts run on the native engine's CPU workers; FSDP
# over several GPUs (one GPU there).
#
# GPU_CHECK_DEVICE=cpu runs the same steps on a CPU, to try the script itself.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}; mkdir -p "$OUT"
PY=${PY:-python3}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
if ! $PY -c "import pydantic, math_verify" 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
[ -d .gpu/cache ] && export POLYRL_CACHE=$PWD/.gpu/cache
{ nvidia-smi -L 2>&1 || true
  $PY -c "import torch; print('torch', torch.__version__, 'cuda available:', torch.cuda.is_available())"
} | tee "$OUT/env.txt"
$PY -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_distributed.py 2>&1 | tee "$OUT/tests.txt"
tests=${PIPESTATUS[0]}
RUN=$(mktemp -d)/run
sed "s/device: cuda/device: $DEVICE/" bench/gpu_run.yaml > "$OUT/gpu_run.yaml"
$PY -m polyrl.cli train "$OUT/gpu_run.yaml" --run-dir "$RUN" 2>&1 | tr '\r' '\n' | grep -v '^ *$' > "$OUT/train.txt"
trained=${PIPESTATUS[0]}
tail -n 25 "$OUT/train.txt"
cp "$RUN/metrics.jsonl" "$OUT/" 2>/dev/null
cp "$RUN/eval/before.json" "$OUT/eval_before.json" 2>/dev/null
cp "$RUN/eval/after.json" "$OUT/eval_after.json" 2>/dev/null
echo "tests exit $tests, training exit $trained"
[ "$tests" = 0 ] && [ "$trained" = 0 ]
