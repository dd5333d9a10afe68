# Sourced by jobs/*.sbatch (from the submit directory): start the job's ranks with the
# launcher that PAL_LAUNCHER names.
#
#   PAL_LAUNCHER=mpiexec  (default) the venv's mpiexec, or PAL_MPIEXEC (the cluster's,
#                         say): hydra for the pinned MPICH wheel (and Intel MPI's),
#                         prterun for Open MPI's; this script adds the flags each needs
#                         to place SLURM_NTASKS ranks, SLURM_NTASKS_PER_NODE a node.
#   PAL_LAUNCHER=srun     SLURM starts the ranks itself (`srun --mpi=PAL_SRUN_MPI`, e.g.
#                         pmix or pmi2; unset: the cluster's MpiDefault).  Needs an MPI
#                         that speaks that PMI: usually the cluster's own, with mpi4py
#                         built against it (docs/other-mpi.md).
#
# Signals: SLURM's `--signal=TERM@120` and `scancel -s TERM` reach the processes of job
# steps.  Under srun the ranks are the step's processes.  hydra starts its proxies with
# srun, so the ranks get the signal too.  Open MPI's mpiexec starts the ranks of its own
# node itself, outside any step, and answers a SIGTERM of its own by killing the ranks:
# with it, ask SLURM for `--signal=B:USR1@120`, which this script passes on to mpiexec
# (Open MPI forwards SIGUSR1 to every rank; pal_hpc treats it as SIGTERM).

# pal_mpi_vendor MPIEXEC: mpich, openmpi, impi or unknown, from `MPIEXEC --version`
# (as pal_hpc.cluster.launch.mpi_vendor tells them apart).
pal_mpi_vendor() {
    local text
    text=$("$1" --version 2>&1 || true)
    case "${text,,}" in
        *"intel(r) mpi"* | *"intel mpi"*) echo impi ;;
        *"open mpi"* | *prrte*) echo openmpi ;;
        *mpich* | *hydra*) echo mpich ;;
        *) echo unknown ;;
    esac
}

# pal_launch COMMAND...: run COMMAND as the job's SLURM_NTASKS ranks; returns the
# launcher's exit status.  SIGUSR1 or SIGTERM to the batch shell is passed on to the
# launcher (see above); after a SIGTERM, PAL_CANCELLED=1 tells pal_run_and_requeue that
# the job was cancelled.
pal_launch() {
    local launcher=${PAL_LAUNCHER:-mpiexec} mpiexec=${PAL_MPIEXEC:-.venv/bin/mpiexec}
    local ntasks=${SLURM_NTASKS:?not in a SLURM job} ppn=${SLURM_NTASKS_PER_NODE:-}
    local -a cmd
    case "$launcher" in
        srun)
            cmd=(srun --kill-on-bad-exit=1 ${PAL_SRUN_MPI:+--mpi="${PAL_SRUN_MPI}"}
                 -n "$ntasks" "$@") ;;
        mpiexec)
            case "$(pal_mpi_vendor "$mpiexec")" in
                openmpi)
                    cmd=("$mpiexec" -n "$ntasks" --bind-to none)
                    [ -n "$ppn" ] && cmd+=(--map-by "ppr:${ppn%%(*}:node")
                    [ "$(id -u)" = 0 ] && cmd+=(--allow-run-as-root)
                    cmd+=("$@") ;;
                *)          # hydra: one node as it finds it, several as listed
                    cmd=("$mpiexec")
                    if [ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ]; then
                        cmd+=(-hosts "$(scontrol show hostnames "${SLURM_JOB_NODELIST}" |
                                        paste -sd, -)" -ppn "${ppn%%(*}")
                    fi
                    cmd+=(-n "$ntasks" "$@") ;;
            esac ;;
        *)
            echo "pal_hpc: PAL_LAUNCHER=${launcher}: expected srun or mpiexec" >&2
            return 2 ;;
    esac
    local signal_to=TERM
    [ "$launcher" = mpiexec ] && [ "$(pal_mpi_vendor "$mpiexec")" = openmpi ] && signal_to=USR1
    "${cmd[@]}" &
    local pid=$! status=0
    # shellcheck disable=SC2064  # expand now: the pid and signal of this launch
    trap "kill -${signal_to} ${pid} 2>/dev/null" USR1
    # SIGTERM reaches the batch shell only when the job itself is cancelled or killed
    # (`scancel` without -s, the end of the time limit): the ranks still get to
    # checkpoint, but pal_run_and_requeue must not bring the job back.
    # shellcheck disable=SC2064
    trap "PAL_CANCELLED=1; kill -${signal_to} ${pid} 2>/dev/null" TERM
    # After a partition the ranks end themselves at their deadline (a line in
    # PAL_PEER_LOST_LOG, set by pal_run_and_requeue), but hydra's mpiexec goes on
    # waiting for the cut-off host's proxy until TCP gives up: once that line is
    # written, the launcher gets PAL_PEER_LOST_GRACE seconds (default 15) to end, then
    # is ended.  Polled each second; `wait` returns early when a trapped signal arrives.
    local lost_log=${PAL_PEER_LOST_LOG:-} grace=${PAL_PEER_LOST_GRACE:-15} mark="" since=""
    [ -n "$lost_log" ] && mark=$(mktemp)
    while kill -0 "$pid" 2>/dev/null; do
        if [ -n "$mark" ] && [ -s "$lost_log" ] && [ "$lost_log" -nt "$mark" ]; then
            since=${since:-$SECONDS}
            if [ $((SECONDS - since)) -ge "$grace" ]; then
                echo "pal_hpc: the ranks gave up on a lost peer (${lost_log}) and the" \
                    "launcher is still running ${grace} s later: ending it" >&2
                kill -TERM "$pid" 2>/dev/null
                sleep 5
                kill -KILL "$pid" 2>/dev/null
                break
            fi
        fi
        sleep 1 &
        wait $! 2>/dev/null || true
    done
    wait "$pid" && status=0 || status=$?
    [ -n "$mark" ] && rm -f "$mark"
    trap - TERM USR1
    return "$status"
}
