#!/usr/bin/env bash
# The wall-clock headline (results/wall-clock-benches.md), measured by the method of docs/design.md "Benchmark method": the demo
# cluster of slowdowns 1,2,4,8 fitted into this machine's cores (on 2 cores: every device
# 2.5x slower, the fastest alone on a core), LeNet on Fashion-MNIST, i.i.d., against the
# cluster's fastest device alone at its best: plain SGD, SGD with Nesterov momentum 0.9 and
# lookahead, each at the best of the same rate sweep (a 90 s trial per rate, as long as the
# runs), then 90 s per run, seeds 0-2, evaluated every 2 s by the low-priority evaluator.
# About 45 minutes on a 2-core machine; keep it quiet meanwhile (one heavy job at a time).
set -euo pipefail
cd "$(dirname "$0")/.."
uptime
.venv/bin/hetsync bench --results-dir results --name fitted-1248 --modes esync-outer --baselines "" \
    --reference sgd,nesterov,lookahead --lr-sweep 0.05,0.1,0.2 --sweep-budget 90 \
    --time-budget 90 --eval-interval 2 --targets 0.85,0.88,0.9 --speedup-at 0.9 \
    --repeats 3 "$@"
uptime
