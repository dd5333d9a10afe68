# Sourced by jobs/*.sbatch (from the submit directory): run the training command, and
# requeue this job when the program stopped early with work left.
#
# SLURM does not requeue a job that ends at its time limit (TIMEOUT) or one whose ranks
# checkpointed and exited, `--requeue` or not.  pal_hpc exits with WORK_LEFT_EXIT (75)
# when it stopped on SIGTERM/SIGUSR1 with its budget not used up; this script then runs
# `scontrol requeue`: the job keeps its id and run directory, SLURM_RESTART_COUNT goes
# up by one, and `--resume auto` continues from the newest checkpoint -- on whatever
# allocation this attempt got: another node count or ranks per node resumes too (the
# replay is re-split over the new nodes; docs/logs.md), and so does a new submission
# of any of the scripts with the same PAL_RUN_DIR.  Exit 0 (budget
# done) and any other status (an error) end the job for good, as do more than
# PAL_MAX_RESTARTS restarts, and so does a cancelled job (SIGTERM to the batch script:
# `scancel` without -s), whatever its ranks' status.
#
# hydra's mpiexec ORs the ranks' exit statuses (75 | 1 == 75 | 2 == 75), so 75 counts
# only when this attempt's summary.json also says exit_status 75.

WORK_LEFT_EXIT=75                       # pal_hpc.runtime.signals.WORK_LEFT_EXIT

# True when RUN_DIR/summary.json was written after STAMP and records exit status 75.
_pal_work_left() {
    local summary="$1/summary.json" stamp=$2
    [ -f "$summary" ] && [ "$summary" -nt "$stamp" ] && .venv/bin/python -c '
import json, sys
sys.exit(json.load(open(sys.argv[1])).get("exit_status") != int(sys.argv[2]))
' "$summary" "$WORK_LEFT_EXIT"
}

# pal_run_and_requeue RUN_DIR COMMAND...: run COMMAND; requeue the job if it stopped
# with work left.  Returns COMMAND's status (0 after a requeue).
pal_run_and_requeue() {
    local run_dir=$1 status=0 stamp restarts=${SLURM_RESTART_COUNT:-0}
    local max=${PAL_MAX_RESTARTS:-50}
    shift
    stamp=$(mktemp)
    echo "pal_hpc: job ${SLURM_JOB_ID:-?} attempt $((restarts + 1)) on ${SLURM_JOB_NODELIST:-?}" \
        "(${SLURM_NTASKS:-?} ranks on ${SLURM_JOB_NUM_NODES:-?} node(s))" \
        "at $(date '+%F %T'); run directory ${run_dir}"
    "$@" || status=$?
    if [ "$status" = "$WORK_LEFT_EXIT" ] && ! _pal_work_left "$run_dir" "$stamp"; then
        echo "pal_hpc: exit status $status but ${run_dir}/summary.json of this attempt" \
            "does not say work is left: a rank failed; not requeueing" >&2
        status=1
    fi
    rm -f "$stamp"
    if [ "${PAL_CANCELLED:-0}" = 1 ]; then        # set by pal_launch (jobs/launch.sh)
        echo "pal_hpc: the job was cancelled (SIGTERM to the batch script); exit status" \
            "${status}; not requeueing"
        return "$status"
    fi
    if [ "$status" != "$WORK_LEFT_EXIT" ]; then
        echo "pal_hpc: exit status ${status}: $([ "$status" = 0 ] && echo done ||
            echo failed); not requeueing"
        return "$status"
    fi
    if [ "$restarts" -ge "$max" ]; then
        echo "pal_hpc: stopped with work left, but the job has restarted ${restarts} times" \
            "(PAL_MAX_RESTARTS=${max}); not requeueing" >&2
        return "$status"
    fi
    echo "pal_hpc: stopped with work left (exit status ${status}); requeueing job" \
        "${SLURM_JOB_ID} (restart $((restarts + 1)))"
    if ! scontrol requeue "${SLURM_JOB_ID}"; then
        echo "pal_hpc: scontrol requeue ${SLURM_JOB_ID} failed; resubmit this script" \
            "to continue" >&2
        return "$status"
    fi
    return 0
}
