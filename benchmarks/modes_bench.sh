#!/usr/bin/env bash
# The `hetsync bench` runs whose tables and figures are committed under results/.
# About 55 minutes on a 2-core machine; note the load average (other work skews timings).
# Every run is repeated with seeds 0, 1, 2 (`--repeats 3`): the tables hold medians and ranges.
#
#   1. every mode and the PyTorch baselines, 4 workers of speeds 1, 1/2, 1/4, 1/8, LeNet,
#      Fashion-MNIST, each at the best of 0.05/0.1/0.2/0.4 after a 10 s trial, then 60 s of
#      training each, evaluated every second (time-to-accuracy, speedup, utilisation);
#   2. hetsync's sync beside DDP on 4 equal workers (throughput of the two implementations);
#   3. local and esync for the same 5 epochs of data at 0.2, the rate run 1 chose for both
#      (final accuracy at equal data);
#   4. esync as in 3, every worker drawing from the whole training set (--partition shared).
set -euo pipefail
cd "$(dirname "$0")/.."
bench=".venv/bin/hetsync bench --results-dir results"
uptime
$bench --name lenet-fmnist-1248 --lr-sweep 0.05,0.1,0.2,0.4 --sweep-budget 10 --repeats 3 \
    --eval-interval 1 "$@"
$bench --name equal-workers-sync-ddp --slowdowns 1,1,1,1 --modes sync --baselines ddp \
    --time-budget 30 --repeats 3 "$@"
$bench --name epochs5-local-esync --modes local,esync --baselines "" --epochs 5 -l 0.2 \
    --repeats 3 --eval-interval 1 "$@"
$bench --name epochs5-esync-shared --modes esync --baselines "" --epochs 5 -l 0.2 \
    --repeats 3 --eval-interval 1 --partition shared "$@"
uptime
