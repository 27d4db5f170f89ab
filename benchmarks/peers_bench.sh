#!/usr/bin/env bash
# The `hetsync bench` runs behind README's eager-SGD and SelSync tables (about 25 minutes on a
# 2-core machine; keep it quiet meanwhile).
#
#   1. 4 equal workers under eager-SGD's random straggler (each step each worker sleeps 4x its
#      step with probability 0.5): sync, esync, eager-solo, eager-majority, selsync, each at
#      the better of 0.1/0.2 after a 5 s trial, then 40 s, seeds 0 and 1;
#   2. the same modes on the 1,2,4,8 cluster, 60 s, seed 0;
#   3. 4 equal workers, non-iid (each worker two classes, --partition class) with SelSync's
#      data injection: sync and selsync (delta 0.02) at 0.2, 60 s, seeds 0 and 1.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=".venv/bin/hetsync bench"
modes=sync,esync,eager-solo,eager-majority,selsync
uptime
$bench --name straggler-equal4 --modes $modes --baselines "" --slowdowns 1,1,1,1 \
    --straggle-prob 0.5 --straggle-delay 4x --lr-sweep 0.1,0.2 --sweep-budget 5 \
    --time-budget 40 --repeats 2 --eval-interval 1 "$@"
$bench --name peers-1248 --modes $modes --baselines "" --lr-sweep 0.1,0.2 --sweep-budget 5 \
    --time-budget 60 --eval-interval 1 "$@"
$bench --name noniid-inject-selsync-avg --modes sync,selsync --baselines "" \
    --slowdowns 1,1,1,1 --partition class --inject --lr-sweep 0.2 --sweep-budget 3 \
    --time-budget 60 --eval-interval 1 --selsync-delta 0.02 --repeats 2 "$@"
uptime
