#!/usr/bin/env bash
# The control for issue 28's gap: a cluster of two *equal* devices with the capacity of the
# fitted 1, 2, 4, 8 cluster (both fitted to 2.667x slower: 0.75 core of demand, as 1, 2, 4, 8
# at 2.5x), DiLoCo's blocking rounds of 8 at rate 0.1, 45 s, beside one of those devices
# alone with its best recipe (lookahead at 0.05, its best horizon: 60 s), back to back,
# seeds 0-2, evaluated every 2 s. If the pair reaches 0.90 1.5x sooner and the 1, 2, 4, 8
# cluster does not, the loss lies in how the heterogeneous cluster trains, not in this
# machine or workload. About 8 minutes on a 2-core machine; keep it quiet meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
common=(--baselines= --eval-interval 2 --targets 0.85,0.88,0.9 --repeats 3
        --workers 2 --slowdowns 1,1 "$@")
uptime
.venv/bin/hetsync bench --results-dir results --name equal2-diloco-45s --time-budget 45 --modes diloco \
    --overlap 0 --reference= -l 0.1 "${common[@]}"
.venv/bin/hetsync bench --results-dir results --name equal2-device-60s --time-budget 60 --modes= \
    --reference lookahead -l 0.05 "${common[@]}"
uptime
