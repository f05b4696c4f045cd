#!/usr/bin/env bash
# The seeds' TPU claims, recorded on the chip in one device call (experiments/tpu/findings.py
# reads what this records): JAX's GPU memory settings against the TPU runtime (one process each)
# and compiled steps' memory_analysis beside memory_stats (one process each).
#   run: bash experiments/tpu/findings_on_chip.sh     -> $OUT/findings.tgz
set -uo pipefail
export PYTHONUNBUFFERED=1
probe="$PWD/experiments/tpu/chip_probe.py"
work="$OUT/findings"
mkdir -p "$work"
python3 "$probe" x --list-prealloc | while read -r name envs; do
  sleep 3   # the chip can refuse a process started just after another ended
  env $envs timeout 90 python3 "$probe" "$work" --prealloc "$name" 2>&1 | grep -v Warning | tail -2
done
for name in exec-gpt-125m-nodonate exec-gpt-125m-remat; do
  sleep 3
  timeout 150 python3 "$probe" "$work" --exec "$name" 2>&1 | grep -v Warning | tail -2
done
(cd "$OUT" && tar czf findings.tgz findings && rm -rf findings)
ls -la "$OUT"
