#!/usr/bin/env bash
# The language-modelling workload: a character-level transformer (gpt-char, 2 layers, 64 wide,
# context 64, 0.11 M parameters) on Shakespeare with AdamW inside, on the fitted 1, 2, 4, 8
# cluster, against the fastest device alone with AdamW, by the method of docs/design.md
# "Benchmark method": each run at the best of the 0.002/0.004/0.008 sweep (a 40 s trial
# each), then 100 s per run, seeds 0-2, judged by validation loss on the held-out plays.
# PARTITION=iid (default): random windows; PARTITION=group: each worker whole plays.
# About 55 minutes (iid) on a 2-core machine; keep it quiet meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
PARTITION=${PARTITION:-iid}
MODES=${MODES:-sync,esync,esync-outer,diloco,async-local-sgd}
uptime
.venv/bin/hetsync bench --results-dir results --name "lm-shakespeare-$PARTITION" --partition "$PARTITION" \
    --dataset shakespeare -n gpt-char --n-layer 2 --n-embd 64 -b 32 --optimizer adamw \
    --modes "$MODES" --baselines "" --reference adamw \
    --lr-sweep 0.002,0.004,0.008 --sweep-budget 40 \
    --time-budget 100 --eval-interval 10 --repeats 3 "$@"
uptime
