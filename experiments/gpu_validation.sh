#!/usr/bin/env bash
# The GPU validation run of issue 5, as ONE prepared script for a machine with a CUDA GPU.
#
#   bash experiments/gpu_validation.sh --prepare  # HERE, once: wheels of what the GPU machine lacks
#   bash experiments/gpu_validation.sh            # THERE, from the repository root
#
# What it does, each step under its own time limit and all of it under one deadline (a step
# that fails, times out or no longer fits is recorded in steps.tsv and the script goes on):
#   1. the GPU test suite (python -m pytest -m gpu: issue 5's Goal on every bundled trace --
#      cupy-pool vs the cupy model and torch vs the pytorch model after every event, the policy
#      backend with zero corruptions for every policy, on-demand within the calibrated
#      granularity, cupy-async, calibration), every report it makes kept;
#   2. allocsim calibrate -> profile.json (the device profile compare --device-profile takes);
#   3. allocsim compare on the bundled trace with that profile, then allocsim validate of its
#      results.json (the winner on real memory), then the CLI once per backend on that trace;
#   4. SUMMARY.md: every report's Markdown table, the step table, the versions.
# Reports go to experiments/results/validation/<date>-<gpu name>/ (JSON + Markdown + PNG per
# run). When $OUT is set (the device tool's output folder) the whole folder is also packed
# into $OUT/validation.tar.gz, with SUMMARY.md, steps.tsv and the pytest log beside it (4 files:
# the device tool brings back at most 8).
#
# Budget: written for the device tool (15 minutes of device time, machine start included; at
# most 600 s per command): every step ends by DEADLINE seconds (default 540) after the start,
# then the summary is written and packed. Call it with timeout_s=600 and carry=[".whl"].
#
# Dependencies: numpy, matplotlib, sortedcontainers, cupy, torch and pytest are on the lent
# H200 machine (its python3 is 3.12); simpy is not, and it reaches no package registry. So
# --prepare (here, where PyPI is reachable) downloads simpy's wheel into .whl/ (ignored through
# .git/info/exclude) as the device tool's README says, and the run installs whatever of
# simpy/sortedcontainers does not import from .whl/ into a folder of its own (never the
# system's site-packages, never the network).

set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}

if [ "${1:-}" = "--prepare" ]; then
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    mkdir -p "$WHEELS"
    for requirement in simpy==4.1.2 sortedcontainers==2.4.0; do
        "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 \
            --platform manylinux2014_x86_64 -d "$WHEELS" "$requirement" || exit 2
    done
    ls -la "$WHEELS"
    echo "prepared: carry [\"$WHEELS\"] with the device tool"
    exit 0
fi

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export MPLBACKEND=Agg PYTHONUNBUFFERED=1

STEP_SHORT=${STEP_SHORT:-120}    # seconds for one validate / calibrate / compare
STEP_SUITE=${STEP_SUITE:-330}    # seconds for the whole pytest -m gpu suite
DEADLINE=${DEADLINE:-540}        # seconds after the start by which every step has ended

# -- dependencies ---------------------------------------------------------------------------
if ! "$PY" -c "import simpy, sortedcontainers" 2>/dev/null; then
    if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        SITE=$(mktemp -d /tmp/allocsim-site.XXXX)
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" "$WHEELS"/*.whl \
            || { echo "error: could not install the wheels in $WHEELS" >&2; exit 2; }
        export PYTHONPATH="$PYTHONPATH:$SITE"
        "$PY" -c "import simpy, sortedcontainers" \
            || { echo "error: simpy/sortedcontainers still missing after $WHEELS" >&2; exit 2; }
    else
        echo "error: simpy or sortedcontainers missing and no wheels in $WHEELS/ to install" \
             "them from (run: bash experiments/gpu_validation.sh --prepare, then carry $WHEELS)" >&2
        exit 2
    fi
fi

ALLOCSIM=("$PY" -m allocsim.sim.cli)

# -- where the reports go -------------------------------------------------------------------
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
if [ -z "$GPU_NAME" ]; then
    GPU_NAME=$("$PY" -c "import cupy; n = cupy.cuda.runtime.getDeviceProperties(0)['name']; \
print(n.decode() if isinstance(n, bytes) else n)" 2>/dev/null || echo unknown-gpu)
fi
SLUG=$(printf '%s' "$GPU_NAME" | tr -cs 'A-Za-z0-9._-' '-' | sed 's/^-*//; s/-*$//')
DATE=$(date -u +%Y-%m-%d)
DIR=${VALIDATION_DIR:-"experiments/results/validation/${DATE}-${SLUG}"}
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

# -- 1. the GPU test suite: issue 5's Goal ---------------------------------------------------
ALLOCSIM_VALIDATION_OUT="$DIR" run pytest-gpu "$STEP_SUITE" \
    "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider tests/test_validator_gpu.py

# -- 2. calibrate ---------------------------------------------------------------------------
PROFILE="$DIR/profile.json"
run calibrate "$STEP_SHORT" "${ALLOCSIM[@]}" calibrate -o "$PROFILE" \
    --measurements "$DIR/calibration-measurements.json"
DEVICE=(--device h200-141g)
[ -f "$PROFILE" ] && DEVICE=(--device-profile "$PROFILE")

# -- 3. compare, validate the winner on real memory, then each backend once through the CLI --
TRACE=traces/data/default-training.npz
run compare-default "$STEP_SHORT" "${ALLOCSIM[@]}" compare "$TRACE" "${DEVICE[@]}" \
    --out "$DIR/compare-default"
if [ -f "$DIR/compare-default/results.json" ]; then
    run validate-compare-winner "$STEP_SHORT" "${ALLOCSIM[@]}" validate \
        "$DIR/compare-default/results.json" --backend policy --out "$DIR/compare-default"
fi
run cli-cupy-pool "$STEP_SHORT" "${ALLOCSIM[@]}" validate "$TRACE" --backend cupy-pool \
    --out "$DIR/cli"
run cli-torch "$STEP_SHORT" "${ALLOCSIM[@]}" validate "$TRACE" --backend torch --out "$DIR/cli"
run cli-cupy-raw "$STEP_SHORT" "${ALLOCSIM[@]}" validate "$TRACE" --backend cupy-raw \
    "${DEVICE[@]}" --out "$DIR/cli"
run cli-cupy-async "$STEP_SHORT" "${ALLOCSIM[@]}" validate "$TRACE" --backend cupy-async \
    --out "$DIR/cli"

# -- 4. summary -----------------------------------------------------------------------------
{
    echo "# GPU validation, $DATE, $GPU_NAME"
    echo
    echo '```'
    cat "$DIR/versions.txt"
    echo '```'
    echo
    echo "## Steps (exit 0 = every check passed, 1 = a check failed, 2 = error, 5 = pytest ran no" \
         "test (no GPU seen), 124 = timed out," \
         "skipped = no time left before the deadline)"
    echo
    echo '```'
    column -t -s $'\t' "$STEPS" 2>/dev/null || cat "$STEPS"
    echo '```'
    echo
    echo "## Reports"
    echo
    echo "### pytest -m gpu (last lines)"
    echo
    echo '```'
    tail -n 25 "$DIR/logs/pytest-gpu.log" 2>/dev/null
    echo '```'
    echo
    for MD in "$DIR"/pytest/*.md "$DIR"/compare-default/*.md "$DIR"/cli/*.md; do
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
