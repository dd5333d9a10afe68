"""`python -m pal_hpc.main [flags]`: the job entry point, on every rank.

    mpiexec -n 4 python -m mpi4py -m pal_hpc.main --env CartPole-v1 --total-steps 100000

Configuration comes from the defaults, then `--config FILE`, then flags
(`--help` lists them).  Nothing is lost and nothing hangs:

- A bad configuration ends the job with exit status 2 and one line naming the field,
  whether every rank finds it or only some (see `runtime.abort.reject`).
- An exception on any rank prints that rank's traceback and aborts the whole job.
- SIGTERM, SIGUSR1 or a first SIGINT checkpoint and stop: with work left (the step and
  wall budgets not used up, the target not reached) the job exits with status 75
  (`signals.WORK_LEFT_EXIT`: resume to continue), else 0, and `summary.json` records
  `stop_reason`, `work_left` and `exit_status`.  A second SIGINT stops at once.
- A final checkpoint that cannot be written (a full disk) ends the job with status 1
  and one message naming the newest checkpoint on disk (`runtime.abort.JobError`).
- A rank dies with its launcher and leaves no /dev/shm files (`runtime.lifeline`).
- No rank waits for another for ever: past `--peer-timeout` its peers are probed, and a
  peer that does not answer (a lost host, a partition) ends the job with exit status
  76, one line naming the operation and the lost hosts (`cluster.deadline`).

PAL_HPC_INJECT_CONFIG_ERROR="RANK[,RANK...]" or "all" makes those ranks reject the
configuration after the topology is built, while the others go on into training:
how the tests show a rejection on some ranks only still ends the job.
"""

from __future__ import annotations

import gc
import io
import os
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import NoReturn


def _parse(args: list[str], rank: int):
    """`load_config(args)` with what argparse prints (`--help`, usage and errors) shown by
    rank 0 alone.  Returns the config, or the exit code argparse asked for."""
    from pal_hpc.config_io import load_config

    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            return load_config(args)
    except SystemExit as exc:
        return 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 2
    finally:
        if rank == 0:
            sys.stdout.write(out.getvalue())
            sys.stderr.write(err.getvalue())
            sys.stdout.flush()
            sys.stderr.flush()


def _injected_rejection(rank: int) -> None:
    """Raise the ConfigError PAL_HPC_INJECT_CONFIG_ERROR asks of this rank, if any."""
    from pal_hpc.config import ConfigError

    spec = os.environ.get("PAL_HPC_INJECT_CONFIG_ERROR", "").strip()
    if spec and (spec == "all" or str(rank) in spec.split(",")):
        raise ConfigError(f"device: injected on rank {rank} (PAL_HPC_INJECT_CONFIG_ERROR)")


def main(argv: list[str] | None = None) -> int:
    # No cyclic garbage collection while the rank imports its stack: torch's thousand
    # modules trigger ~380 collections, a tenth of the import's CPU time, and
    # every rank of a job pays it.  `runtime.entry.train` turns it back on (and freezes
    # what the imports made) once they are done (`runtime.imports`, which pauses it
    # again while the ranks that use torch import it); `finally` for the paths that
    # stop before (a bad flag, --help).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _main(argv)
    finally:
        if collecting:
            gc.enable()


def _bf16_note(cfg) -> str | None:
    """The start-up warning for bf16 learners on a CPU without native bf16 (rank 0's;
    torch is imported only when the run asks for bf16)."""
    precision = getattr(cfg.algo_config, "precision", "fp32")
    if precision != "bf16":
        return None
    from pal_hpc.algos.nets import bf16_cpu_note

    return bf16_cpu_note(precision, cfg.device)


def _main(argv: list[str] | None) -> int:
    from pal_hpc.runtime import lifeline, signals

    lifeline.tie_to_launcher()       # first: a rank must never outlive its launcher
    signals.install()

    from mpi4py import MPI

    from pal_hpc.cluster import deadline
    from pal_hpc.config import Config, ConfigError
    from pal_hpc.runtime.abort import JobError, abort_job, reject

    # From here on every wait for another rank has a deadline (--peer-timeout, its
    # default until the flags are read): the runtime's communicators all derive from
    # this watched world.
    world = deadline.start(Config.peer_timeout)
    rank = world.Get_rank()
    lifeline.unlink_node_segments(world)
    control = MPI.COMM_WORLD.Dup()   # for `reject` alone, so nothing else can match it
    args = sys.argv[1:] if argv is None else argv
    try:
        cfg = _parse(args, rank)
    except ConfigError as exc:
        reject(control, f"pal_hpc: invalid configuration: {exc}")
    if isinstance(cfg, int):         # argparse's exit: 0 after --help, 2 for a bad flag
        if cfg == 0:
            control.Free()
            return 0
        reject(control, "" if rank == 0 else "pal_hpc: invalid command line (see --help)",
               code=cfg)

    try:
        deadline.set_timeout(cfg.peer_timeout)
        if not cfg.run_dir and cfg.resume not in ("", "latest", "auto"):
            cfg.run_dir = str(Path(cfg.resume).resolve().parent.parent)  # the checkpoint's run
        if not cfg.run_dir:           # one timestamped directory for the whole job
            cfg.run_dir = world.bcast(cfg.resolved_run_dir() if rank == 0 else None, root=0)
        deadline.set_record(str(Path(cfg.run_dir) / "peer_lost.log"))

        from pal_hpc.cluster.topology import build_topology, uneven_nodes_note
        from pal_hpc.plan import plan_at_startup
        from pal_hpc.runtime.entry import train

        plan = plan_at_startup(world, cfg)     # None unless a per-node count is auto
        topo = build_topology(world, cfg, plan)
        notes = (uneven_nodes_note(topo.node_sizes, cfg.ranks_per_node),
                 _bf16_note(cfg) if rank == 0 else None)
        for note in notes:
            if rank == 0 and note:
                print(note, flush=True)
        _injected_rejection(rank)
        status = train(cfg, topo)
        topo.free()                   # collective: only once every rank got here
    except ConfigError as exc:        # on every rank, or only on some (e.g. the learners)
        reject(control, f"pal_hpc: invalid configuration: {exc}")
    except JobError as exc:           # on every rank, after the job wound down
        reject(control, f"pal_hpc: error: {exc}", code=exc.status)
    except BaseException:
        abort_job(1, f"pal_hpc: rank {rank} failed:\n{traceback.format_exc()}")
    control.Free()
    deadline.stop()
    if status:
        # `python -m mpi4py` turns a non-zero exit into MPI_Abort (and "Abort(75)" lines);
        # this stop is not a failure, so finalize first (every rank gets here together).
        MPI.Finalize()
    return status


def _needs_exit_handlers() -> str:
    """What in this process still needs the interpreter's exit handlers ("" if nothing):
    an open HDF5 file (the library flushes it at exit), a lockstep env still open (its
    handler closes it), a child process, a thread that is not a daemon, or a tool that
    writes its data at exit (a tracer, coverage)."""
    import threading

    h5py = sys.modules.get("h5py")
    if h5py is not None and h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE):
        return "an HDF5 file is open"
    procs = sys.modules.get("pal_hpc.envs.lockstep_procs")
    if procs is not None and any(not getattr(env, "closed", True) for env in procs._LIVE):
        return "a lockstep env is open"
    mp = sys.modules.get("multiprocessing")
    if mp is not None and mp.active_children():
        return "a child process is alive"
    if any(t.is_alive() and not t.daemon for t in threading.enumerate()
           if t is not threading.main_thread()):
        return "a thread is running"
    if sys.gettrace() is not None or "coverage" in sys.modules:
        return "a tracer is on"
    return ""


def finish(status: int) -> NoReturn:
    """End this rank with `status` once `main` has returned: finalize MPI (what `python
    -m mpi4py` would do at exit), flush the output, and leave through the C library's
    exit, without the interpreter's teardown.  That teardown frees torch's thousand
    modules object by object: 0.6-0.8 s of CPU a rank on a Zen 3 core, a fifth of a short
    job's CPU time, and a test suite starts hundreds of ranks.  Where something still
    needs the exit handlers (`_needs_exit_handlers`) the rank exits the usual way."""
    if _needs_exit_handlers():
        sys.exit(status)
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    # exit(3), not os._exit: the C libraries' exit handlers run, and MPICH's tell its
    # launcher this process is done (after os._exit hydra's proxy kills the ranks still
    # running, even after MPI_Finalize).  PyDLL keeps the GIL: no Python thread runs
    # while the libraries wind down.
    import ctypes

    ctypes.PyDLL(None).exit(status)
    os._exit(status)            # not reached


if __name__ == "__main__":
    finish(main())
