#!/usr/bin/env bash
# The `hetsync bench` runs behind results/wall-clock-benches.md's oversubscribed-emulation `esync-outer` tables (about 110
# minutes on a 2-core machine; keep it quiet meanwhile). Every run's local rate follows the
# bench's default cosine schedule over its budget, as `hetsync launch` does.
#
#   1. the 1,2,4,8 demo cluster, LeNet, Fashion-MNIST, i.i.d.: local (sequential SGD on the
#      fastest device alone), sync, esync (as published), esync-outer (the launch default),
#      async; each at the rate of 0.05/0.1/0.2 with the best final accuracy after a trial as
#      long as the runs (60 s, evaluated at its end: the best rate depends on the horizon,
#      and the table's final accuracy is after 60 s), then 60 s, seeds 0-2;
#   2. the same cluster on non-IID data, esync, esync-outer, sync, async, each at the best of
#      0.05/0.1/0.2 after a 60 s trial, 60 s, seeds 0-2: (a) --partition class, ESync's -s 1: each worker a
#      block of classes; (b) --partition dirichlet --dirichlet-alpha 0.1. (esync-outer runs
#      its non-IID rounds there: blocking, at most 4 local steps.)
set -euo pipefail
cd "$(dirname "$0")/.."
bench=".venv/bin/hetsync bench --results-dir results"
common=(--baselines "" --lr-sweep 0.05,0.1,0.2 --sweep-budget 60 --time-budget 60
        --eval-interval 1 --speedup-at 0.85)
uptime
$bench --name outer-1248 --modes local,sync,esync,esync-outer,async --repeats 3 \
    "${common[@]}" "$@"
$bench --name noniid-class --modes sync,esync,esync-outer,async --partition class \
    --repeats 3 "${common[@]}" "$@"
$bench --name noniid-dirichlet --modes sync,esync,esync-outer,async \
    --partition dirichlet --dirichlet-alpha 0.1 --repeats 3 "${common[@]}" "$@"
uptime
