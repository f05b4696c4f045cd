#!/usr/bin/env bash
# Every chip recording of experiments/tpu in one device call (the chip's time is scarce):
#   run: bash experiments/tpu/run_on_chip.sh   (carry .tpu-inputs: the traces to replay, .npz)
# Packs what it recorded into $OUT/records.tgz.part-* (the device tool brings back 8 files).
set -uo pipefail
export PYTHONUNBUFFERED=1
here="$(dirname "$0")"
rec="$OUT/rec"
start=$SECONDS
timeout 420 python3 "$here/chip_probe.py" "$rec" --traces .tpu-inputs --budget-s 300 2>&1 \
  | grep -v '^ ' | tee "$OUT/log-main.txt"
for name in $(python3 "$here/chip_probe.py" x --list-exec); do
  if (( SECONDS - start > 530 )); then echo "$name: skipped (time)"; continue; fi
  sleep 3   # the chip can refuse a program started just after another ended
  timeout 90 python3 "$here/chip_probe.py" "$rec" --exec "$name" 2>&1 | tail -3
done
cp "$OUT/log-main.txt" "$rec/" 2>/dev/null
(cd "$OUT" && tar czf records.tgz rec && rm -rf rec && split -b 15M records.tgz records.tgz.part- \
  && rm records.tgz)
ls -la "$OUT"
