#!/usr/bin/env bash
# Where the runtime holds scratch (experiments/tpu/scratch_place_probe.py), one process per
# probe, in one device call:  bash experiments/tpu/scratch_place_on_chip.sh  -> $OUT/scratch-place.tgz
set -uo pipefail
export PYTHONUNBUFFERED=1
here="$(dirname "$0")"
work="$OUT/scratch-place"
mkdir -p "$work"
for name in scratch-fill scratch-empty; do
  sleep 3   # the chip can refuse a process started just after another ended
  timeout 240 python3 "$here/scratch_place_probe.py" "$work" --only "$name" 2>&1 | grep -v -i warn | tail -4
done
(cd "$OUT" && tar czf scratch-place.tgz scratch-place && rm -rf scratch-place)
ls -la "$OUT"
