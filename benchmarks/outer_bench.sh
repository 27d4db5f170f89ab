#!/usr/bin/env bash
# The `hetsync bench` runs behind README's "faster than its fastest device" tables (about 40
# minutes on a 2-core machine; keep it quiet meanwhile).
#
#   1. the 1,2,4,8 demo cluster, LeNet, Fashion-MNIST, i.i.d.: local (sequential SGD on the
#      fastest device alone), sync, esync (as published), esync-outer (the launch default),
#      async; each at the best of 0.05/0.1/0.2 after a 6 s trial, then 60 s, seeds 0-2;
#   2. the same cluster on non-IID data (--partition class, ESync's -s 1: each worker a block
#      of classes): esync, esync-outer, sync, async, each at the best of 0.05/0.1/0.2, 60 s,
#      seeds 0-1.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=".venv/bin/hetsync bench"
uptime
$bench --name outer-1248 --modes local,sync,esync,esync-outer,async --baselines "" \
    --lr-sweep 0.05,0.1,0.2 --sweep-budget 6 --time-budget 60 --repeats 3 --eval-interval 1 \
    --speedup-at 0.85 "$@"
$bench --name outer-1248-noniid --modes sync,esync,esync-outer,async --baselines "" \
    --partition class --lr-sweep 0.05,0.1,0.2 --sweep-budget 6 --time-budget 60 --repeats 2 \
    --eval-interval 1 --speedup-at 0.85 "$@"
uptime
