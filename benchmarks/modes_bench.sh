#!/usr/bin/env bash
# The three `hetsync bench` runs whose tables and figures are committed under results/.
# About 25 minutes on a 2-core machine; note the load average (other work skews timings).
#
#   1. every mode and the PyTorch baselines, 4 workers of speeds 1, 1/2, 1/4, 1/8, LeNet,
#      Fashion-MNIST, 60 s of training each (time-to-accuracy, speedup, utilisation);
#   2. hetsync's sync beside DDP on 4 equal workers (throughput of the two implementations);
#   3. local, sync and esync for the same 5 epochs of data (final accuracy at equal data).
set -euo pipefail
cd "$(dirname "$0")/.."
bench=".venv/bin/hetsync bench"
uptime
$bench --name lenet-fmnist-1248 "$@"
$bench --name equal-workers-sync-ddp --slowdowns 1,1,1,1 --modes sync --baselines ddp "$@"
$bench --name epochs5-local-sync-esync --modes local,sync,esync --baselines "" --epochs 5 "$@"
uptime
