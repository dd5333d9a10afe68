"""`python -m pal_hpc.main [flags]`: the job entry point, on every rank.

    mpiexec -n 4 python -m mpi4py -m pal_hpc.main --env CartPole-v1 --total-steps 100000

Configuration comes from the defaults, then `--config FILE`, then flags
(`--help` lists them).  A bad configuration is rejected on every rank before
any work starts, naming the field.  An exception on any rank prints that
rank's traceback once and aborts the whole job, so nothing hangs.
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path


def _reject(world, exc) -> int:
    """Every rank found the same bad configuration: rank 0 says so once, then all exit 2.
    The barrier keeps a fast rank's exit (which aborts the job under `-m mpi4py`) from
    cutting rank 0 off before it has printed."""
    if world.Get_rank() == 0:
        print(f"pal_hpc: invalid configuration: {exc}", file=sys.stderr, flush=True)
    world.Barrier()
    return 2


def main(argv: list[str] | None = None) -> int:
    from mpi4py import MPI

    from pal_hpc.config import ConfigError, load_config
    from pal_hpc.runtime import signals

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    args = sys.argv[1:] if argv is None else argv
    if rank != 0 and ("-h" in args or "--help" in args):
        return 0                       # one copy of the help text, from rank 0
    try:
        cfg = load_config(args)
    except ConfigError as exc:
        return _reject(world, exc)
    except SystemExit as exc:         # argparse: --help, or an unknown flag
        return int(exc.code or 0)

    if not cfg.run_dir and cfg.resume not in ("", "latest", "auto"):
        cfg.run_dir = str(Path(cfg.resume).resolve().parent.parent)   # the checkpoint's run
    if not cfg.run_dir:               # one timestamped directory for the whole job
        cfg.run_dir = world.bcast(cfg.resolved_run_dir() if rank == 0 else None, root=0)
    signals.install()
    try:
        from pal_hpc.dist.topology import build_topology
        from pal_hpc.runtime.run import train

        topo = build_topology(world, cfg)
        try:
            train(cfg, topo)
        finally:
            topo.free()
    except ConfigError as exc:       # found while building (e.g. roles vs ranks): same on every rank
        return _reject(world, exc)
    except BaseException:
        sys.stderr.write(f"pal_hpc: rank {rank} failed:\n{traceback.format_exc()}")
        sys.stderr.flush()
        # Give the launcher a moment to forward the traceback before the abort tears
        # its I/O down (without it the message is sometimes lost).
        time.sleep(0.5)
        world.Abort(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
