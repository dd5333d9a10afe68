# Sourced by jobs/*.sbatch (from the submit directory): run the training command, and
# requeue this job when the program stopped early with work left or lost a node.
#
# SLURM does not requeue a job that ends at its time limit (TIMEOUT) or one whose ranks
# checkpointed and exited, `--requeue` or not.  pal_hpc exits with WORK_LEFT_EXIT (75)
# when it stopped on SIGTERM/SIGUSR1 with its budget not used up; this script then runs
# `scontrol requeue`: the job keeps its id and run directory, SLURM_RESTART_COUNT goes
# up by one, and `--resume auto` continues from the newest checkpoint -- on whatever
# allocation this attempt got: another node count or ranks per node resumes too (the
# replay is re-split over the new nodes; docs/logs.md), and so does a new submission
# of any of the scripts with the same PAL_RUN_DIR.
#
# A lost node is requeued too: the job's own deadline found a peer that no longer
# answers (a line in RUN_DIR/peer_lost.log this attempt: a host cut off or gone), or
# the launcher reports a rank killed by SIGKILL, which pal_hpc never sends itself (a
# host's ranks killed, the OOM killer, a node going down).  The next attempt resumes
# from the newest checkpoint that verifies, on the allocation SLURM gives it.
#
# Exit 0 (budget done) and any other status (an error) end the job for good, as do more
# than PAL_MAX_RESTARTS restarts, and so does a cancelled job (SIGTERM to the batch
# script: `scancel` without -s), whatever its ranks' status.
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

# Copy standard input to standard output line by line, and append the launcher's lines
# about a rank that ended badly to FILE.
_pal_keep_reports() {
    awk -v keep="$1" '{ print; fflush() }
        /BAD TERMINATION|EXIT CODE: |RUNNING AT |exited on signal/ { print >> keep; fflush(keep) }'
}

# Why this attempt lost a node, or nothing: RUN_DIR's peer_lost.log written after STAMP
# (the ranks' deadline), or the launcher's report of a rank killed by SIGKILL in
# LAUNCH_LOG (its stderr: hydra's "BAD TERMINATION ... EXIT CODE: 9", Open MPI's
# "exited on signal 9").
_pal_lost_node() {
    local lost="$1/peer_lost.log" stamp=$2 launch_log=$3
    if [ -s "$lost" ] && [ "$lost" -nt "$stamp" ]; then
        echo "a peer stopped answering: $(tail -n 1 "$lost" | cut -c1-300)"
    elif [ -s "$launch_log" ] && grep -q "BAD TERMINATION" "$launch_log" &&
            grep -q "EXIT CODE: 9$" "$launch_log"; then
        echo "the launcher reports a rank killed by SIGKILL" \
            "($(grep -m1 "RUNNING AT" "$launch_log" | sed 's/^[= ]*//'))"
    elif [ -s "$launch_log" ] && grep -q "exited on signal 9" "$launch_log"; then
        echo "the launcher reports a rank killed by SIGKILL"
    fi
}

# pal_run_and_requeue RUN_DIR COMMAND...: run COMMAND; requeue the job if it stopped
# with work left or lost a node.  Returns COMMAND's status (0 after a requeue).
# COMMAND's stderr also goes to a temporary file (what the launcher said), and
# PAL_PEER_LOST_LOG tells pal_launch (jobs/launch.sh) where the ranks' deadline
# writes, so that it can end a launcher still waiting for a cut-off host.
pal_run_and_requeue() {
    local run_dir=$1 status=0 stamp restarts=${SLURM_RESTART_COUNT:-0} launch_log lost=""
    local max=${PAL_MAX_RESTARTS:-50}
    shift
    stamp=$(mktemp)
    launch_log=$(mktemp)
    echo "pal_hpc: job ${SLURM_JOB_ID:-?} attempt $((restarts + 1)) on ${SLURM_JOB_NODELIST:-?}" \
        "(${SLURM_NTASKS:-?} ranks on ${SLURM_JOB_NUM_NODES:-?} node(s))" \
        "at $(date '+%F %T'); run directory ${run_dir}"
    # Both streams pass through as they are; the launcher's reports of a rank that
    # ended badly are also kept (hydra prints its banner on stdout, Open MPI on stderr).
    local out_fd err_fd out_pid err_pid
    exec {out_fd}> >(_pal_keep_reports "$launch_log")
    out_pid=$!
    exec {err_fd}> >(_pal_keep_reports "$launch_log" >&2)
    err_pid=$!
    PAL_PEER_LOST_LOG="${run_dir}/peer_lost.log" "$@" >&"$out_fd" 2>&"$err_fd" || status=$?
    exec {out_fd}>&- {err_fd}>&-
    # The filters end at the end of their input: at most 5 s more (a process of the
    # job that is still alive may hold it open).
    for _ in $(seq 50); do
        kill -0 "$out_pid" 2>/dev/null || kill -0 "$err_pid" 2>/dev/null || break
        sleep 0.1
    done
    if [ "$status" != 0 ] && [ "$status" != "$WORK_LEFT_EXIT" ]; then
        lost=$(_pal_lost_node "$run_dir" "$stamp" "$launch_log")
    fi
    if [ "$status" = "$WORK_LEFT_EXIT" ] && ! _pal_work_left "$run_dir" "$stamp"; then
        echo "pal_hpc: exit status $status but ${run_dir}/summary.json of this attempt" \
            "does not say work is left: a rank failed; not requeueing" >&2
        status=1
    fi
    rm -f "$stamp" "$launch_log"
    if [ "${PAL_CANCELLED:-0}" = 1 ]; then        # set by pal_launch (jobs/launch.sh)
        echo "pal_hpc: the job was cancelled (SIGTERM to the batch script); exit status" \
            "${status}; not requeueing"
        return "$status"
    fi
    if [ "$status" != "$WORK_LEFT_EXIT" ] && [ -z "$lost" ]; then
        echo "pal_hpc: exit status ${status}: $([ "$status" = 0 ] && echo done ||
            echo failed); not requeueing"
        return "$status"
    fi
    local why="stopped with work left (exit status ${status})"
    [ -n "$lost" ] && why="lost a node (exit status ${status}): ${lost}"
    if [ "$restarts" -ge "$max" ]; then
        echo "pal_hpc: ${why}, but the job has restarted ${restarts} times" \
            "(PAL_MAX_RESTARTS=${max}); not requeueing" >&2
        return "$status"
    fi
    echo "pal_hpc: ${why}; requeueing job ${SLURM_JOB_ID} (restart $((restarts + 1)))"
    if ! scontrol requeue "${SLURM_JOB_ID}"; then
        echo "pal_hpc: scontrol requeue ${SLURM_JOB_ID} failed; resubmit this script" \
            "to continue" >&2
        return "$status"
    fi
    return 0
}
