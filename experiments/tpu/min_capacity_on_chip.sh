#!/usr/bin/env bash
# min-capacity's answers for TPU steps, proved on the chip in one device call: each step at its
# predicted HBM (experiments/tpu/min-capacity-predicted.json), 1 MiB above, 512 B and 1 MiB
# below, one process each.  bash experiments/tpu/min_capacity_on_chip.sh -> $OUT/min-capacity/
set -uo pipefail
export PYTHONUNBUFFERED=1
here="$(dirname "$0")"
work="$OUT/min-capacity"
mkdir -p "$work"
for size in small 125m; do
  need=$(python3 -c "import json; print(json.load(open('$here/min-capacity-predicted.json'))['predictions']['$size']['min_capacity'])")
  for delta in ${DELTAS:-1048576 0 -512 -1048576}; do
    sleep 3   # the chip can refuse a process started just after another ended
    timeout 150 python3 "$here/min_capacity_probe.py" "$work" --size "$size" --capacity $((need + delta)) 2>&1 \
      | grep -v -i warn | tail -2
  done
done
ls -la "$work"
