#!/usr/bin/env bash
# The checks that need a GPU node, in one run of about 6-8 minutes on 16 cores and one
# GPU (an H200 in mind), printing each section's result; end to end on a CPU machine
# with --quick (everything tiny) to check the script itself.
#
#   bash bench/device_check.sh [--quick] [--require-gpu] [--wheels DIR] [--python PY]
#
# Sections:
#   1. the CUDA tests (pytest -m cuda: they skip without a GPU; with --require-gpu or
#      PAL_REQUIRE_GPU=1 they fail instead);
#   2. DQN's Nature-CNN learner updates/s (batch 32, 4x84x84 frames) on the GPU, fp32 and
#      bf16, against one CPU core (bench/profile_learner.py --image);
#   3. TD3 and SAC on Pendulum-v1, time to a greedy -200 at -n 1,2,4,8,16 with the split
#      batch (--learner-batch split, the default; learners on the GPU by --device auto),
#      one seed (bench/bench_continuous.py --no-peer);
#   4. PAAC on ALE/Pong-v5 at -n 16 with the master on the GPU: env steps/s beside the
#      PAAC paper's ~3,000/s (bench/bench_paac_atari.py --no-peer);
#   5. the planner's error at -n 16 (--actors-per-node auto --learners-per-node auto:
#      summary.json's plan.relative_error, predicted vs measured).
#
# Setup on the GPU node (no internet).  torch with CUDA, mpi4py, h5py and cython are
# installed there.  gymnasium, ale-py, the MPI runtime (the `mpich` wheel that
# requirements.txt pins; it puts mpiexec beside python) and opencv-python-headless
# come as wheels in a local directory: --wheels DIR (or PAL_WHEELS=DIR; default
# ./wheels), made beforehand on a machine with internet by
#     pip download -d wheels gymnasium[classic-control]==1.4.0 ale-py==0.12.1 \
#         mpich==5.0.2 opencv-python-headless==5.0.0.93 pytest
# The script then makes .venv-gpu (--system-site-packages, so the node's torch, mpi4py
# and h5py are used), installs the wheels into it with pip --no-index and builds
# pal_hpc's native core there.  With --python PY (or in --quick mode, the repo's .venv)
# that interpreter is used as it is and nothing is installed.
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
QUICK=0
WHEELS=${PAL_WHEELS:-$ROOT/wheels}
PY=""
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --require-gpu) export PAL_REQUIRE_GPU=1 ;;
        --wheels) WHEELS=$2; shift ;;
        --python) PY=$2; shift ;;
        -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
        *) echo "device_check: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

if [ -z "$PY" ] && [ $QUICK = 1 ] && [ -x .venv/bin/python ]; then
    PY=.venv/bin/python
fi
if [ -z "$PY" ]; then
    PY=.venv-gpu/bin/python
    if [ ! -x "$PY" ]; then
        python3 -m venv --system-site-packages .venv-gpu || exit 1
    fi
    if ! "$PY" -c "import gymnasium, ale_py, mpi4py, pal_hpc.replay" 2>/dev/null; then
        [ -d "$WHEELS" ] || { echo "device_check: no wheel directory $WHEELS (see --help)" >&2; exit 1; }
        "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" \
            "gymnasium[classic-control]" ale-py mpich opencv-python-headless pytest || exit 1
        "$PY" -m pip install --quiet --no-build-isolation --no-deps -e . || exit 1
    fi
fi
T0=$(date +%s)
FAILED=()
section() { echo; echo "=== $1  (t = $(( $(date +%s) - T0 )) s)"; }
run() {   # run LIMIT_S CMD...: one section's command under an outer timeout
    local limit=$1; shift
    timeout --kill-after=10 "$limit" "$@"
    local rc=$?
    [ $rc = 0 ] || { echo "device_check: exit $rc from: $*"; FAILED+=("$*"); }
}
"$PY" - <<'PYEOF'
import os, torch
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
print(f"device_check: torch {torch.__version__}, CUDA {torch.version.cuda}, GPU {gpu}, "
      f"{os.cpu_count()} cores")
PYEOF
HAS_GPU=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))")

if [ $QUICK = 1 ]; then
    NPS=1,2; STEPS=1500; CONT_FLAGS="--learning-starts 500 --eval-every 500 --eval-episodes 1"
    RUN_S=120; CNN_ITERS=5; PONG_NP=3; PONG="--warmup-steps 1600 --steps 3200"; PLAN_NP=3
    PLAN_STEPS=1500; TARGET=-1e9; PONG_S=400
else
    NPS=1,2,4,8,16; STEPS=20000; CONT_FLAGS=""; RUN_S=30; CNN_ITERS=300
    PONG_NP=16; PONG="--warmup-steps 3000 --steps 15000"; PLAN_NP=16; PLAN_STEPS=30000
    TARGET=-200; PONG_S=150
fi

section "1. CUDA tests (PAL_REQUIRE_GPU=${PAL_REQUIRE_GPU:-0})"
run 240 "$PY" -m pytest -q -m cuda tests/

section "2. DQN Nature-CNN learner, batch 32: GPU vs one CPU core"
if [ "$HAS_GPU" = 1 ]; then
    run 120 "$PY" bench/profile_learner.py --algo dqn --image --batch 32 --device cuda \
        --precision both --iters "$CNN_ITERS" --rounds 1 | tee /tmp/device_check_gpu.txt
else
    echo "no GPU: skipped the GPU side"
fi
run 180 "$PY" bench/profile_learner.py --algo dqn --image --batch 32 --device cpu \
    --iters $(( CNN_ITERS > 30 ? 30 : CNN_ITERS )) --rounds 1 | tee /tmp/device_check_cpu.txt
"$PY" - <<'PYEOF'
import re
def rate(path):
    try:
        return [float(x.replace(",", "")) for x in
                re.findall(r"= ([\d,.]+) updates/s", open(path).read())]
    except OSError:
        return []
gpu, cpu = rate("/tmp/device_check_gpu.txt"), rate("/tmp/device_check_cpu.txt")
if gpu and cpu:
    print(f"Nature-CNN updates/s: GPU fp32 {gpu[0]:,.0f}" +
          (f", GPU bf16 {gpu[1]:,.0f}" if len(gpu) > 1 else "") +
          f", one CPU core {cpu[0]:,.1f}: GPU fp32 / CPU = {gpu[0] / cpu[0]:.0f}x")
PYEOF
rm -f /tmp/device_check_gpu.txt /tmp/device_check_cpu.txt

section "3. TD3 and SAC on Pendulum-v1 to $TARGET at -n $NPS (split batch)"
run $(( RUN_S * 12 + 60 )) "$PY" bench/bench_continuous.py --algos td3,sac --nps "$NPS" \
    --seeds 1 --no-peer --total-steps "$STEPS" --target="$TARGET" --timeout "$RUN_S" \
    --pal-flags="--learner-batch split $CONT_FLAGS"

section "4. PAAC ALE/Pong-v5 at -n $PONG_NP, master on the GPU (paper: ~3,000 env steps/s)"
run "$PONG_S" "$PY" bench/bench_paac_atari.py --nps "$PONG_NP" --variants fp32 --no-peer $PONG

section "5. planner's error at -n $PLAN_NP (DQN CartPole-v1, actors and learners auto)"
PLAN_DIR=$(mktemp -d)
run 150 "$(dirname "$PY")/mpiexec" -n "$PLAN_NP" "$PY" -m mpi4py -m pal_hpc.main \
    --actors-per-node auto --learners-per-node auto --total-steps "$PLAN_STEPS" \
    --eval-every 0 --eval-episodes 1 --progress-every 1000 --run-dir "$PLAN_DIR/run" \
    > "$PLAN_DIR/log" 2>&1 || tail -5 "$PLAN_DIR/log"
"$PY" - "$PLAN_DIR/run/summary.json" <<'PYEOF'
import json, sys
try:
    plan = json.load(open(sys.argv[1])).get("plan", {})
except OSError:
    sys.exit("no summary.json: the planner run failed")
err = plan.get("relative_error", {})
print(f"split: {plan.get('actors')} actors, {plan.get('learners')} learners")
for key, value in err.items():
    shown = "n/a" if value is None else f"{value:+.1%}"
    print(f"  {key:<24} predicted {plan.get(key, float('nan')):10.1f}  "
          f"measured {plan['measured'][key]:10.1f}  error {shown}")
PYEOF
rm -rf "$PLAN_DIR"

section "done"
if [ ${#FAILED[@]} -gt 0 ]; then
    printf 'device_check: %d section(s) failed:\n' ${#FAILED[@]}; printf '  %s\n' "${FAILED[@]}"
    exit 1
fi
echo "device_check: every section ran"
