#!/usr/bin/env bash
# `hetsync advise` checked against real runs (issue 58): probe emulated devices on this
# machine, advise on the profile they give (every candidate, 3 seeds, on the virtual clock),
# then the same candidates on the real clock (`hetsync bench`, the same devices emulated, the
# same rates, 3 seeds), side by side: every scheme on each subset of the fastest devices that
# advise tried, and the fastest device's recipes alone. Keep the machine quiet: the probe and
# the real benches are wall-clock measurements.
#
#   benchmarks/advise_vs_real.sh [OUT]      # SLOWDOWNS=1,3 BUDGET=20 by default
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/advise-vs-real}
SLOWDOWNS=${SLOWDOWNS:-1,3}
BUDGET=${BUDGET:-20}
WORKERS=$(awk -F, '{print NF}' <<<"$SLOWDOWNS")
BIN=.venv/bin
rm -rf "$OUT" && mkdir -p "$OUT"
$BIN/torchrun --standalone --nproc-per-node "$WORKERS" -m hetsync probe \
    --slowdowns "$SLOWDOWNS" -o "$OUT/profile.json"
$BIN/hetsync advise "$OUT/profile.json" --budget "$BUDGET" --repeats 3 -o "$OUT/advice"
real() {  # NAME SLOWDOWNS MODES REFERENCE
    $BIN/hetsync bench --workers "$(awk -F, '{print NF}' <<<"$2")" --slowdowns "$2" \
        --oversubscribe 1 --modes "$3" --baselines "" --reference "$4" \
        --time-budget "$BUDGET" --targets 0.85 --eval-interval 1 --repeats 3 \
        --name "$1" -ld "$OUT/runs" --results-dir "$OUT"
}
# the fastest device's recipes alone, then the schemes on each subset advise tried (the
# fastest k devices: the slowdowns sorted, the first k)
real alone "$(cut -d, -f1 <<<"$(tr , '\n' <<<"$SLOWDOWNS" | sort -g | paste -sd,)")" "" \
    nesterov,lookahead
for k in $($BIN/python -c "import json, sys; print(*sorted({c['devices'] for c in json.load(open(sys.argv[1]))['ranked'] if c['devices'] > 1}, reverse=True))" "$OUT/advice/advice.json"); do
    real "devices-$k" "$(tr , '\n' <<<"$SLOWDOWNS" | sort -g | head -n "$k" | paste -sd,)" \
        sync,esync-outer,diloco,async ""
done
