#!/usr/bin/env bash
# The fitted 1, 2, 4, 8 cluster's best recipe beside its fastest device at its best and the
# default, each at its best horizon, one reference step for all (given, 6 ms per batch of 64:
# every device's nominal speed the same in the three benches, whatever the machine's drift):
# balanced DiLoCo (batches 64, 32, 16, 8; H 8, blocking, rate 0.1; every worker drawing from
# the whole set) for 45 s; the fastest device alone, lookahead at 0.05, for 60 s; esync-outer
# at 0.1 for 60 s. Seeds 0-2, evaluated every 2 s. About 13 minutes on a 2-core machine; keep
# it quiet meanwhile (one heavy job at a time).
set -euo pipefail
cd "$(dirname "$0")/.."
common=(--baselines= --eval-interval 2 --targets 0.85,0.88,0.9 --repeats 3 --step-work 0.006
        "$@")
uptime
.venv/bin/hetsync bench --results-dir results --name balanced-diloco-45s --time-budget 45 --modes diloco \
    --overlap 0 --balanced-batches 1 --partition shared --reference= -l 0.1 "${common[@]}"
.venv/bin/hetsync bench --results-dir results --name balanced-device-60s --time-budget 60 --modes= \
    --reference lookahead -l 0.05 "${common[@]}"
.venv/bin/hetsync bench --results-dir results --name balanced-default-60s --time-budget 60 --modes esync-outer \
    --reference= -l 0.1 "${common[@]}"
uptime
