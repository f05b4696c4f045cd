#!/usr/bin/env bash
# `allocsim validate --backend jax` on the chip, for the bundled traces and the real recordings
# converted into .tpu-inputs/*.npz, plus chip_probe's midrun and too-large probes; one device call.
#   build here:  pip install --no-deps --target .tpu-site . simpy   (the chip has JAX and numpy)
#   run:         bash experiments/tpu/validate_on_chip.sh   (carry .tpu-site and .tpu-inputs)
# Everything lands in $OUT/chip.tgz (the device tool brings back a few files only).
set -uo pipefail
repo="$PWD"
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$repo/.tpu-site"   # the machine's JAX first
work="$OUT/chip"
mkdir -p "$work/validate" "$work/rec"
cd /tmp   # not the repository: its allocsim/ folder would shadow the installed package
timeout 150 python3 "$repo/experiments/tpu/chip_probe.py" "$work/rec" \
  --only env,midrun,too-large > "$work/probe.log" 2>&1
echo "probes: exit $?; $(grep -c . "$work/probe.log") log lines"
for trace in "$repo"/traces/data/*.npz "$repo"/.tpu-inputs/*.npz; do
  name="$(basename "$trace" .npz)"
  sleep 2   # the chip can refuse a process started just after another ended
  start=$SECONDS
  timeout 150 python3 -m allocsim validate "$trace" --backend jax --json \
    > "$work/validate/$name.json" 2> "$work/validate/$name.err"
  echo "$name: exit $? in $((SECONDS - start)) s; $(tail -c 200 "$work/validate/$name.err")"
done
(cd "$OUT" && tar czf chip.tgz chip && rm -rf chip)
ls -la "$OUT"
