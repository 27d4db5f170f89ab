#!/usr/bin/env bash
# ESync's outer-optimizer default beside the peers users pick today, built from the same
# parts: DiLoCo (a fixed H of inner steps on every worker), asynchronous local SGD (delayed
# Nesterov, local steps in proportion to each worker's speed) and FedBuff (K buffered deltas
# weighted by staleness), on the fitted 1, 2, 4, 8 cluster, against the fastest device alone
# at its best (Nesterov momentum, lookahead), by the method of docs/design.md "Benchmark
# method": every run at the best of the 0.05/0.1/0.2 sweep (a 90 s trial each), then 90 s per
# run, seeds 0-2. About 65 minutes on a 2-core machine; keep it quiet meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
uptime
.venv/bin/hetsync bench --results-dir results --name peers-fitted-1248 \
    --modes esync-outer,diloco,async-local-sgd,fedbuff --baselines "" \
    --reference nesterov,lookahead --lr-sweep 0.05,0.1,0.2 --sweep-budget 90 \
    --time-budget 90 --eval-interval 2 --targets 0.85,0.88,0.9 --speedup-at 0.9 \
    --repeats 3 "$@"
uptime
