#!/usr/bin/env bash
# The `hetsync bench` runs behind results/wall-clock-benches.md's DGS / gradient dropping / DGC tables (about 35
# minutes on a 2-core machine; keep it quiet meanwhile; the second needs root).
#
# 4 workers of speeds 1, 1, 1/2, 1/4 (slowdowns 1,1,2,4), LeNet, Fashion-MNIST, each mode at
# the best of 0.05/0.1/0.2 after a 6 s trial, then 45 s per run, seeds 0 and 1: async, gd,
# dgc, dgs, esync, sync,
#   1. on loopback (no limit);
#   2. each rank on its own emulated host behind 100 Mbit/s both ways (--bandwidth 100mbit).
set -euo pipefail
cd "$(dirname "$0")/.."
bench=".venv/bin/hetsync bench --results-dir results"
common=(--modes async,gd,dgc,dgs,esync,sync --baselines "" --slowdowns 1,1,2,4
        --lr-sweep 0.05,0.1,0.2 --sweep-budget 6 --time-budget 45 --repeats 2 --eval-interval 1)
uptime
$bench --name sparse-1124 "${common[@]}" "$@"
$bench --name sparse-1124-100mbit --bandwidth 100mbit "${common[@]}" "$@"
uptime
