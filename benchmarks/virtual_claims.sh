#!/usr/bin/env bash
# The README's speed claim on the virtual clock (issue 56): the demo cluster 1, 2, 4, 8 at
# its nominal speeds (reference step given: 6 ms per batch of 64, this machine's LeNet step on
# a quiet day), LeNet on Fashion-MNIST, i.i.d., balanced batches (64, 32, 16, 8), against the
# fastest device alone at its best (lookahead, SGD with Nesterov momentum), each at the best
# of one rate sweep, at horizons of 15 and 25 virtual seconds, seeds 0-2.
#
#   benchmarks/virtual_claims.sh LINK NAME [bench flags]   e.g.
#   benchmarks/virtual_claims.sh 10gbit 1248-10gbit                                  # DiLoCo H 8, sync
#   benchmarks/virtual_claims.sh 10gbit 1248-10gbit-h2 --modes diloco --inner-steps 2 \
#       --reuse runs/bench-virtual-1248-10gbit
#   benchmarks/virtual_claims.sh 100mbit 1248-100mbit --reuse runs/bench-virtual-1248-10gbit
#
# Its figures do not depend on the machine's load, only its real time does (35-70 min on 2
# cores; --reuse takes the fastest device's runs, which cross no link, from an earlier bench).
set -euo pipefail
cd "$(dirname "$0")/.."
link=$1 name=$2
shift 2
.venv/bin/hetsync bench --results-dir results --name "virtual-$name" --clock virtual --link-bandwidth "$link" \
    --step-work 0.006 --workers 4 --slowdowns 1,2,4,8 --balanced-batches 1 \
    --modes diloco,sync --baselines "" --reference lookahead,nesterov \
    --lr-sweep 0.05,0.1,0.2 --sweep-budget 10 --horizons 15,25 --eval-interval 1 \
    --targets 0.85,0.88,0.9 --speedup-at 0.9 --repeats 3 -ld runs "$@"
