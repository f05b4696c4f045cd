#!/usr/bin/env bash
# The scripts of experiments/tpu/scripts on the chip, unchanged: each measured, then given
# exactly its predicted min-capacity and 256 KiB less.  -> $OUT/scripts.tgz
set -uo pipefail
export PYTHONUNBUFFERED=1
here="$(dirname "$0")"
work="$OUT/scripts"
mkdir -p "$work"
predicted="$here/../../tests/data/tpu/scripts/predicted.json"
for name in ${SCRIPTS:-eager_mix eval_loop}; do
  need=$(python3 -c "import json; print(json.load(open('$predicted'))['predictions']['$name']['min_capacity'])")
  for capacity in "" "--capacity $need" "--capacity $((need - 262144))"; do
    sleep 2
    timeout 120 python3 "$here/script_probe.py" "$work" --script "$name" $capacity 2>&1 \
      | grep -v -i "warn" | tail -1
  done
done
cd "$OUT" && tar czf scripts.tgz scripts && rm -r scripts
