#!/usr/bin/env bash
# The JAX recorder on the chip: a jitted and an op-by-op training run recorded with the runtime's own
# records beside each (NAME.runtime.npz), then fidelity of those through the tpu model.
#   run: bash experiments/tpu/record_on_chip.sh   (carry .tpu-site)  -> $OUT/rec/
set -uo pipefail
repo=$PWD; R=$OUT/rec; mkdir -p $R
cd /tmp
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$repo/.tpu-site"
export PYTHONUNBUFFERED=1
timeout 150 python3 -m allocsim record --framework jax -o $R/train.npz -- python3 $repo/experiments/jax_train.py --steps 10 2>&1 | grep -v -i warn | tail -4
sleep 2
timeout 150 python3 -m allocsim record --framework jax -o $R/train-nojit.npz -- python3 $repo/experiments/jax_train.py --steps 3 --no-jit 2>&1 | grep -v -i warn | tail -4
ls -la $R
for n in train train-nojit; do
  python3 -c "
import json,sys
from allocsim.traces.formats import load
t = load('$R/$n.npz'); print('$n', json.dumps(t.metadata.get('runtime_records')), t.metadata.get('end_check'))"
  timeout 60 python3 -m allocsim fidelity $R/$n.runtime.npz 2>&1 | tail -3
  timeout 60 python3 -m allocsim info $R/$n.runtime.npz 2>&1 | sed -n 1,9p
done
