#!/usr/bin/env bash
# The programs of experiments/tpu/programs.py on the chip, in one device call: each run whole
# (measured), then given exactly its predicted min-capacity and 256 KiB less (a ballast fills
# the rest), one process each.
#   bash experiments/tpu/programs_on_chip.sh [measure|answer|below ...] -> $OUT/programs/
set -uo pipefail
export PYTHONUNBUFFERED=1
here="$(dirname "$0")"
work="$OUT/programs"
mkdir -p "$work"
predicted="$here/../../tests/data/tpu/programs/${PREDICTED:-predicted.json}"
programs=${PROGRAMS:-"lstm-nodonate init-train-eval conv-adam moe-bf16 decoder-remat near-hbm"}
for stage in "${@:-measure answer below}"; do
  for name in $programs; do
    need=$(python3 -c "import json; print(json.load(open('$predicted'))['predictions']['$name']['min_capacity'])")
    case $stage in
      measure) capacity="" ;;
      answer) capacity="--capacity $need" ;;
      below) capacity="--capacity $((need - 262144))" ;;
    esac
    sleep 2   # the chip can refuse a process started just after another ended
    timeout 150 python3 "$here/program_probe.py" "$work" --program "$name" $capacity 2>&1 \
      | grep -v -i "warn" | tail -1
  done
done
