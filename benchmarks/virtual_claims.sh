#!/usr/bin/env bash
# The README's speed claims on the virtual clock (issue 56): the demo cluster 1, 2, 4, 8 at
# its nominal speeds, i.i.d., balanced batches (every device's step takes as long), against
# the fastest device alone at its best, seeds 0-2. Two workloads (WORKLOAD=...):
#   lenet (default)  LeNet on Fashion-MNIST; reference step 6 ms per batch of 64 (this
#                    machine's on a quiet day); DiLoCo and sync against lookahead and SGD with
#                    Nesterov momentum, each at the best of one rate sweep, horizons 15, 25 s
#   lm               the 2-layer, 64-wide character transformer on Shakespeare; reference step
#                    20.67 ms per batch of 32; sync and DiLoCo against AdamW at 0.004 (the
#                    wall-clock sweep's best), 100 s, evaluated every 5 s
#
#   benchmarks/virtual_claims.sh LINK NAME [bench flags]   e.g.
#   benchmarks/virtual_claims.sh 10gbit 1248-10gbit                                  # DiLoCo H 8, sync
#   benchmarks/virtual_claims.sh 10gbit 1248-10gbit-h2 --modes diloco --inner-steps 2 \
#       --reuse runs/bench-virtual-1248-10gbit
#   benchmarks/virtual_claims.sh 100mbit 1248-100mbit --reuse runs/bench-virtual-1248-10gbit
#   WORKLOAD=lm benchmarks/virtual_claims.sh 10gbit lm-1248-10gbit
#
# Its figures do not depend on the machine's load, only its real time does (LeNet: 35-70 min
# on 2 cores; lm: about 0.36 virtual s per real s for the cluster, 45 min; --reuse takes the
# fastest device's runs, which cross no link, from an earlier bench).
set -euo pipefail
cd "$(dirname "$0")/.."
link=$1 name=$2
shift 2
case ${WORKLOAD:-lenet} in
  lenet) workload=(--step-work 0.006 --modes diloco,sync --reference lookahead,nesterov
                   --lr-sweep 0.05,0.1,0.2 --sweep-budget 10 --horizons 15,25 --eval-interval 1
                   --targets 0.85,0.88,0.9 --speedup-at 0.9) ;;
  lm) workload=(--step-work 0.02067 --dataset shakespeare --partition iid -n gpt-char
                --n-layer 2 --n-embd 64 -b 32 --optimizer adamw --modes sync,diloco
                --reference adamw -l 0.004 --time-budget 100 --eval-interval 5
                --targets 2.2,2.0,1.9 --speedup-at 1.9) ;;
  *) echo "WORKLOAD: invalid value '${WORKLOAD}'; expected lenet or lm" >&2; exit 2 ;;
esac
.venv/bin/hetsync bench --results-dir results --name "virtual-$name" --clock virtual --link-bandwidth "$link" \
    --workers 4 --slowdowns 1,2,4,8 --balanced-batches 1 --baselines "" --repeats 3 -ld runs \
    "${workload[@]}" "$@"
