#!/usr/bin/env bash
# The `hetsync bench` runs whose tables and figures are committed under results/.
# About 40 minutes on a 2-core machine; note the load average (other work skews timings).
#
#   1. every mode and the PyTorch baselines, 4 workers of speeds 1, 1/2, 1/4, 1/8, LeNet,
#      Fashion-MNIST, each at the best of 0.05/0.1/0.2 after a 15 s trial, then 60 s of
#      training each (time-to-accuracy, speedup, utilisation);
#   2. hetsync's sync beside DDP on 4 equal workers (throughput of the two implementations);
#   3. local and esync for the same 5 epochs of data, each at the rate run 1 chose
#      (final accuracy at equal data);
#   4. sync, esync and DDP at 0.2 (a one-rate "sweep": no linear scaling), the rate run 1 chose
#      for each of the three, for 60 s (the comparison that matters for ESync, in 6 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
bench=".venv/bin/hetsync bench"
uptime
$bench --name lenet-fmnist-1248 --lr-sweep 0.05,0.1,0.2 --sweep-budget 15 "$@"
$bench --name equal-workers-sync-ddp --slowdowns 1,1,1,1 --modes sync --baselines ddp \
    --time-budget 30 "$@"
$bench --name epochs5-local-esync --modes local,esync --baselines "" --epochs 5 -l 0.2 "$@"
$bench --name esync-sync-ddp-lr0.2 --modes sync,esync --baselines ddp --lr-sweep 0.2 --sweep-budget 3 \
    --time-budget 60 "$@"
uptime
