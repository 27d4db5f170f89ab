#!/usr/bin/env bash
# `hetsync advise` checked against real runs (issue 58): probe two emulated devices on this
# machine, advise on the profile they give (every candidate, 3 seeds, on the virtual clock),
# then the same candidates on the real clock (`hetsync bench`, the same devices emulated, the
# same rates, 3 seeds), side by side. Keep the machine quiet: the probe and the real bench
# are wall-clock measurements.
#
#   benchmarks/advise_vs_real.sh [OUT]      # SLOWDOWNS=1,3 BUDGET=20 by default
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/advise-vs-real}
SLOWDOWNS=${SLOWDOWNS:-1,3}
BUDGET=${BUDGET:-20}
WORKERS=$(awk -F, '{print NF}' <<<"$SLOWDOWNS")
BIN=.venv/bin
rm -rf "$OUT" && mkdir -p "$OUT"
$BIN/torchrun --standalone --nproc-per-node "$WORKERS" -m hetsync probe \
    --slowdowns "$SLOWDOWNS" -o "$OUT/profile.json"
$BIN/hetsync advise "$OUT/profile.json" --budget "$BUDGET" --repeats 3 -o "$OUT/advice"
# the same candidates, the real devices: every scheme on all the devices, the fastest's recipes
$BIN/hetsync bench --workers "$WORKERS" --slowdowns "$SLOWDOWNS" --oversubscribe 1 \
    --modes sync,esync-outer,diloco,async --baselines "" --reference nesterov,lookahead \
    --time-budget "$BUDGET" --targets 0.85 --eval-interval 1 --repeats 3 \
    --name real -ld "$OUT/runs" --results-dir "$OUT"
