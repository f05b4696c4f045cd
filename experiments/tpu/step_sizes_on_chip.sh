#!/usr/bin/env bash
# experiments/tpu/step_sizes_probe.py on the chip in one device call: every size and form in a
# process of its own, the two-process question, then each profile converted by allocsim (carried
# as .tpu-site) into an .npz trace of the runtime's own records.
#   run: bash experiments/tpu/step_sizes_on_chip.sh   (carry .tpu-site)  -> $OUT/steps.tgz.part-*
set -uo pipefail
export PYTHONUNBUFFERED=1
repo="$PWD"
probe="$repo/experiments/tpu/step_sizes_probe.py"
rec="$OUT/steps"
mkdir -p "$rec"
start=$SECONDS
for name in $(python3 "$probe" x --list); do
  if (( SECONDS - start > 360 )); then echo "$name: skipped (time)"; continue; fi
  sleep 3   # the chip can refuse a program started just after another ended
  timeout 100 python3 "$probe" "$rec" --step "$name" 2>&1 | grep -v Warning | tail -2
done
sleep 3
python3 "$probe" "$rec" --share holder 2>&1 | tail -1 &
sleep 12
timeout 30 python3 "$probe" "$rec" --share second 2>&1 | tail -1
wait
cd /tmp   # the chip's own JAX is on PYTHONPATH; allocsim comes from the carried site folder
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$repo/.tpu-site"
for dir in "$rec"/*/; do
  name="$(basename "$dir")"
  timeout 40 python3 -m allocsim convert "$dir" -o "$rec/$name.npz" 2>&1 | tail -1
  case "$name" in small-*|mid-*) ;; *) rm -rf "$dir" ;; esac   # large profiles: the .npz only
done
(cd "$OUT" && tar czf steps.tgz steps && rm -rf steps && split -b 15M steps.tgz steps.tgz.part- \
  && rm steps.tgz)
ls -la "$OUT"
