#!/usr/bin/env bash
# The CUDA path, on a machine with one GPU (about 5 minutes): tests/test_gpu.py, every mode
# on the GPU over gloo (three emulated workers sharing it), a one-worker
# run over NCCL, gpt-char's step on the GPU, and esync-outer with four emulated workers
# sharing the GPU over gloo. Uses the machine's own python3 with torch (PYTHON=...), the
# package from src/ (no install), wheels in .whl/ if any (starlette, uvicorn, httptools and
# their dependencies, for any Python: `pip download --only-binary=:all: --python-version V`),
# and data in .gpudata/ if present (HETSYNC_DATA layout). Writes runs and logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT/runs"
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --find-links .whl --no-compile --no-cache-dir \
      --target /tmp/site starlette uvicorn httptools && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
[ -d .gpudata ] && export HETSYNC_DATA="$PWD/.gpudata"
nvidia-smi -L
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'gpus', torch.cuda.device_count(), torch.cuda.get_device_name(0), 'nccl', torch.cuda.nccl.version())"
run() { echo "== $*"; "$PY" -m hetsync "$@"; echo "== exit $?"; }
common=(-ld "$OUT/runs" --no-figures)

echo "== tests/test_gpu.py"
timeout 360 "$PY" -m pytest -q -rs -p no:cacheprovider tests/test_gpu.py
echo "== exit $?"

# every mode on the GPU over gloo (three emulated workers sharing it), six at a time
one_mode() {
  local mode=$1 workers=3 slowdowns=1,2,4
  case $mode in local|lookahead) workers=1 slowdowns=1;; esac
  timeout 120 "$PY" -m hetsync launch -m "$mode" --workers $workers --slowdowns $slowdowns -g 0 \
      -n lenet --time-budget 4 --eval-interval 2 --quiet --no-live --run-name "mode-$mode" \
      "${common[@]}" >"$OUT/runs/mode-$mode.out" 2>&1
  echo "$mode exit $?" >>"$OUT/runs/mode-$mode.out"
}
i=0
for mode in local lookahead sync esync esync-outer diloco async dcasgd async-local-sgd fedbuff \
            eager-solo eager-majority selsync gd dgc dgs ddp post-local-sgd; do
  one_mode "$mode" & i=$((i + 1))
  [ $((i % 6)) = 0 ] && wait
done
wait
for f in "$OUT"/runs/mode-*.out; do
  tail -1 "$f"; grep -h -E "^final|^wall|warning: rank" "$f" | head -3
  if ! tail -1 "$f" | grep -q "exit 0"; then tail -25 "$f"; fi
done

HETSYNC_BACKEND=nccl timeout 90 "$PY" -m hetsync launch -m sync --workers 1 --slowdowns 1 \
    -g 0 -n lenet --time-budget 6 --eval-interval 3 --quiet --no-live --run-name nccl-1 \
    "${common[@]}"; echo "== nccl-1 exit $?"

lm=(--dataset shakespeare -n gpt-char -b 32 --optimizer adamw --eval-interval 10)
timeout 90 "$PY" -m hetsync worker -m local -g 0 "${lm[@]}" --time-budget 30 \
    --run-name lm-gpu "${common[@]}"; echo "== lm-gpu exit $?"
timeout 120 "$PY" -m hetsync launch -m esync-outer --workers 4 --slowdowns 1,2,4,8 -g 0 \
    "${lm[@]}" --time-budget 30 --quiet --no-live --run-name lm-esync-outer-gpu \
    "${common[@]}"; echo "== lm-esync-outer-gpu exit $?"
tar -czf "$OUT/runs.tgz" -C "$OUT" runs && rm -rf "$OUT/runs"
