#!/usr/bin/env bash
# The GPU validation run of issue 5, as ONE prepared script for a machine with a CUDA GPU.
#
#   bash experiments/gpu_validation.sh            # from the repository root
#
# What it does, each step under its own time limit and all of it under one deadline (a step
# that fails, times out or no longer fits is recorded in steps.tsv and the script goes on):
#   1. calibrate the GPU (allocsim calibrate) -> profile.json;
#   2. allocsim validate for every backend on every bundled trace (traces/data/*.npz):
#      cupy-pool, torch, policy (on-demand, preallocate, best-fit, bfc, pytorch), cupy-raw (with
#      the calibrated profile: its granularity is what "within the measured granularity"
#      means), cupy-async, host;
#   3. allocsim compare on the bundled trace, then allocsim validate of its results.json (the
#      winner on real memory);
#   4. the GPU test suite (python -m pytest -m gpu -q), every report it makes kept;
#   5. SUMMARY.md: every report's Markdown table, the step table, the versions.
# Reports go to experiments/results/validation/<date>-<gpu name>/ (JSON + Markdown + PNG per
# run). When $OUT is set (the device tool's output folder) the whole folder is also packed
# into $OUT/validation.tar.gz, with SUMMARY.md, steps.tsv and the pytest log beside it.
#
# Budget: written for the device tool (15 minutes of device time, machine start included; at
# most 600 s per command): every step ends by DEADLINE seconds (default 540) after the start,
# then the summary is written and packed. Expected on an H200: a few minutes in all.
#
# Dependencies: numpy, matplotlib, cupy (and torch for the torch backend) are expected on the
# GPU machine. simpy and sortedcontainers may be missing there, and such a machine may have no
# package registry: carry them as wheels, made beforehand on a machine that has one:
#     pip download simpy sortedcontainers -d wheels/
# and carry wheels/ (it is ignored by git: name it in the device tool's `carry`). This script
# installs from wheels/ only when an import fails, and never reaches the network.

set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export MPLBACKEND=Agg
PY=${PYTHON:-python}

STEP_SHORT=${STEP_SHORT:-120}    # seconds for one validate / calibrate
STEP_SUITE=${STEP_SUITE:-420}    # seconds for the whole pytest -m gpu suite
DEADLINE=${DEADLINE:-540}        # seconds after the start by which every step has ended

# -- dependencies ---------------------------------------------------------------------------
if ! "$PY" -c "import simpy, sortedcontainers" 2>/dev/null; then
    if [ -d wheels ]; then
        "$PY" -m pip install --no-index --find-links wheels simpy sortedcontainers \
            || echo "warning: could not install simpy/sortedcontainers from wheels/" >&2
    else
        echo "error: simpy or sortedcontainers missing and no wheels/ to install them from" \
             "(pip download simpy sortedcontainers -d wheels/ on a machine with a registry)" >&2
        exit 2
    fi
fi

ALLOCSIM=("$PY" -m sim.cli)

# -- where the reports go -------------------------------------------------------------------
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
if [ -z "$GPU_NAME" ]; then
    GPU_NAME=$("$PY" -c "import cupy; n = cupy.cuda.runtime.getDeviceProperties(0)['name']; \
print(n.decode() if isinstance(n, bytes) else n)" 2>/dev/null || echo unknown-gpu)
fi
SLUG=$(printf '%s' "$GPU_NAME" | tr -cs 'A-Za-z0-9._-' '-' | sed 's/^-*//; s/-*$//')
DATE=$(date -u +%Y-%m-%d)
DIR="experiments/results/validation/${DATE}-${SLUG}"
mkdir -p "$DIR"
STEPS="$DIR/steps.tsv"
printf 'step\texit\tseconds\n' > "$STEPS"

# run NAME LIMIT COMMAND...: one step under a time limit (cut to what is left before the
# deadline; skipped when under 20 s are left); its output in $DIR/logs/NAME.log.
mkdir -p "$DIR/logs"
run() {
    local name=$1 limit=$2
    shift 2
    local left=$((DEADLINE - SECONDS))
    if [ "$left" -lt 20 ]; then
        printf '%s\tskipped\t0\n' "$name" >> "$STEPS"
        printf '%-60s skipped (deadline)\n' "$name"
        return 0
    fi
    [ "$limit" -gt $((left - 5)) ] && limit=$((left - 5))
    local start=$SECONDS
    timeout --kill-after=15 "$limit" "$@" > "$DIR/logs/$name.log" 2>&1
    local rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >> "$STEPS"
    printf '%-60s exit %-3s %4ss\n' "$name" "$rc" "$((SECONDS - start))"
    return 0
}

{
    echo "gpu: $GPU_NAME"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
    "$PY" - <<'EOF'
import platform, numpy
print("python", platform.python_version(), "numpy", numpy.__version__)
try:
    import cupy
    rt = cupy.cuda.runtime
    print("cupy", cupy.__version__, "cuda runtime", rt.runtimeGetVersion(), "driver api",
          rt.driverGetVersion())
except Exception as err:
    print("cupy: unavailable:", err)
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available",
          torch.cuda.is_available())
except Exception as err:
    print("torch: unavailable:", err)
EOF
} > "$DIR/versions.txt" 2>&1
cat "$DIR/versions.txt"

# -- 1. calibrate ---------------------------------------------------------------------------
PROFILE="$DIR/profile.json"
run calibrate "$STEP_SHORT" "${ALLOCSIM[@]}" calibrate -o "$PROFILE" \
    --measurements "$DIR/calibration-measurements.json"

# -- 2. every backend on every bundled trace (the issue's Goal first) ------------------------
for TRACE in traces/data/*.npz; do
    T=$(basename "$TRACE" .npz)
    run "validate-$T-cupy-pool" "$STEP_SHORT" "${ALLOCSIM[@]}" validate "$TRACE" \
        --backend cupy-pool --out "$DIR"
    run "validate-$T-torch" "$STEP_SHORT" "${ALLOCSIM[@]}" validate "$TRACE" \
        --backend torch --out "$DIR"
    for POLICY in on-demand preallocate best-fit bfc pytorch; do
        run "validate-$T-policy-$POLICY" "$STEP_SHORT" "${ALLOCSIM[@]}" validate "$TRACE" \
            --backend policy --policy "$POLICY" --out "$DIR"
    done
    if [ -f "$PROFILE" ]; then
        run "validate-$T-cupy-raw" "$STEP_SHORT" "${ALLOCSIM[@]}" validate "$TRACE" \
            --backend cupy-raw --device-profile "$PROFILE" --out "$DIR"
    else
        run "validate-$T-cupy-raw" "$STEP_SHORT" "${ALLOCSIM[@]}" validate "$TRACE" \
            --backend cupy-raw --out "$DIR"
    fi
    run "validate-$T-cupy-async" "$STEP_SHORT" "${ALLOCSIM[@]}" validate "$TRACE" \
        --backend cupy-async --out "$DIR"
    run "validate-$T-host-best-fit" "$STEP_SHORT" "${ALLOCSIM[@]}" validate "$TRACE" \
        --backend host --policy best-fit --capacity 16GiB --out "$DIR"
done

# -- 3. compare, then validate the winner on real memory -------------------------------------
run compare-default "$STEP_SHORT" "$PY" -m sim.cli compare --device h200-141g \
    --out "$DIR/compare-default"
if [ -f "$DIR/compare-default/results.json" ]; then
    run validate-compare-winner "$STEP_SHORT" "${ALLOCSIM[@]}" validate \
        "$DIR/compare-default/results.json" --backend policy --out "$DIR/compare-default"
fi

# -- 4. the GPU test suite ------------------------------------------------------------------
ALLOCSIM_VALIDATION_OUT="$DIR" run pytest-gpu "$STEP_SUITE" \
    "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider tests/test_validator_gpu.py

# -- 5. summary -----------------------------------------------------------------------------
{
    echo "# GPU validation, $DATE, $GPU_NAME"
    echo
    echo '```'
    cat "$DIR/versions.txt"
    echo '```'
    echo
    echo "## Steps (exit 0 = every check passed, 1 = a check failed, 2 = error, 124 = timed out," \
         "skipped = no time left before the deadline)"
    echo
    echo '```'
    column -t -s $'\t' "$STEPS" 2>/dev/null || cat "$STEPS"
    echo '```'
    echo
    echo "## Reports"
    echo
    for MD in "$DIR"/*.md "$DIR"/compare-default/*.md; do
        [ -f "$MD" ] && [ "$(basename "$MD")" != SUMMARY.md ] && { cat "$MD"; echo; }
    done
} > "$DIR/SUMMARY.md"
echo "wrote $DIR/SUMMARY.md"

if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    tar -czf "$OUT/validation.tar.gz" -C "$(dirname "$DIR")" "$(basename "$DIR")"
    cp "$DIR/SUMMARY.md" "$DIR/steps.tsv" "$OUT/" 2>/dev/null
    cp "$DIR/logs/pytest-gpu.log" "$OUT/pytest-gpu.log" 2>/dev/null
    echo "packed $DIR into $OUT/validation.tar.gz"
fi
