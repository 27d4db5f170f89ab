#!/usr/bin/env bash
# The fitted 1, 2, 4, 8 cluster against its fastest device at its best, each row at each of
# three horizons: a time to 0.90 depends on how long the rate's cosine takes to fall, and
# the fastest device alone, slower through the data, is at its best at a horizon the cluster
# need not share. Rates: the best of the sweep after a 45 s trial; then each row at 30, 45 and
# 60 s of training, seeds 0-2, evaluated every 2 s by the low-priority evaluator. The fastest
# device's best recipe at a target is the best of its recipes at every horizon.
# About 35 minutes on a 2-core machine; keep it quiet meanwhile (one heavy job at a time).
set -euo pipefail
cd "$(dirname "$0")/.."
uptime
.venv/bin/hetsync bench --results-dir results --name horizons-1248 --modes esync-outer --baselines "" \
    --reference nesterov,lookahead --lr-sweep 0.05,0.1,0.2 --sweep-budget 45 \
    --horizons 30,45,60 --eval-interval 2 --targets 0.85,0.88,0.9 --speedup-at 0.9 \
    --repeats 3 "$@"
uptime
