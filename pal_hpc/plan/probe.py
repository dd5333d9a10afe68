"""The planner's collective measurements, among MPI ranks: r(L), one phase's Allreduce
among L learners, and g(L), an update of L learners computing and reducing at once
(the docstring of `pal_hpc.plan.measure` says what each stands for).  Run among the
job's ranks at start-up, or in a helper `mpiexec` job for the CLI
(`measure_sync_here`, which runs `python -m pal_hpc.plan --sync-probe`)."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time

import numpy as np

from pal_hpc.plan.model import Layout
from pal_hpc.runtime.pacing import REDUCING_SLEEP


def sync_counts(layout: Layout, splits: list[tuple[int, ...]], most: int = 12) -> list[int]:
    """The total learner counts (>= 2) whose Allreduce to measure: all of them when
    few, else `most` spread evenly in log2 (the rest are interpolated)."""
    counts = sorted({sum(s) for s in splits if sum(s) >= 2})
    if len(counts) <= most:
        return counts
    picks = {counts[0], counts[-1]}
    for i in range(1, most - 1):
        target = counts[0] * (counts[-1] / counts[0]) ** (i / (most - 1))
        picks.add(min(counts, key=lambda c: abs(math.log2(c) - math.log2(target))))
    return sorted(picks)


def _over_members(comm, counts: list[int], order: list[int] | None, body) -> dict[int, float]:
    """Collective over `comm`: for each L in `counts` (up to the size), the first L ranks
    of `order` (default: by rank) run `body(sub, L)` on their own communicator and
    return seconds; the others sleep meanwhile.  Returns, on rank 0 of `comm` (which
    must be first in `order`), {L: the slowest member's result}; {} elsewhere."""
    from mpi4py import MPI

    from pal_hpc.cluster.collectives import wait_all

    rank, size = comm.Get_rank(), comm.Get_size()
    order = list(range(size)) if order is None else list(order)
    out = {}
    for n in counts:
        if n > size:
            continue
        members = order[:n]
        mine = rank in members
        sub = comm.Split(0 if mine else MPI.UNDEFINED, members.index(rank) if mine else 0)
        result = 0.0
        if mine:
            try:
                result = body(sub, n)
            finally:
                sub.Free()
        wait_all(comm)
        results = comm.gather(result if mine else None, root=0)
        if rank == 0:
            out[n] = max(r for r in results if r is not None)
    return out


def _reduce(sub, send, recv) -> None:
    """One Iallreduce polled as the runtime's learner polls it (Test, else 20 us sleep)."""
    from mpi4py import MPI

    req = sub.Iallreduce(send, recv, op=MPI.SUM)
    while not req.Test():
        time.sleep(REDUCING_SLEEP)


def measure_sync(comm, counts: list[int], floats: int, order: list[int] | None = None,
                 reps: int = 8) -> dict[int, float]:
    """Collective over `comm`: for each L in `counts`, the first L ranks of `order`
    (default: by rank) post `reps` Iallreduces of `floats` float32 and poll each as a
    learner does (Test, else a short sleep); the others sleep meanwhile.  Returns, on
    rank 0 of `comm` (which must be first in `order`), {L: the slowest member's median
    seconds per Allreduce}; {} elsewhere."""
    send = np.ones(floats + 3, np.float32)     # + the learner's three vote slots
    recv = np.empty_like(send)

    def body(sub, n):
        times = []
        for _ in range(reps + 1):              # the first warms up
            t0 = time.perf_counter()
            _reduce(sub, send, recv)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    return _over_members(comm, counts, order, body)


def measure_gang(comm, counts: list[int], cfg, rows: dict[int, int],
                 order: list[int] | None = None, blocks: int = 4) -> dict[int, float]:
    """Collective over `comm`: g(L), the wall seconds per update of L learners working
    at once where the roles will put them.  Each member runs `cfg`'s real update on
    `rows[L]` rows (measure.UpdateStandIn) and ends each phase with the Iallreduce of
    that phase's gradient, polled as a learner polls it, then applies the mean.  It
    holds what u and r(L) measured apart miss: L learners on fewer free cores finish a
    phase one after another (the phase ends at the last one's gradient), a reduction
    waits for a member that is not running, and processes taking turns on a core evict
    each other's caches.  Returns {L: the slowest member's median over `blocks` blocks
    of updates (one period of the algorithm's phases, e.g. TD3's critic, then critic
    and actor)} on rank 0; {} elsewhere."""
    from pal_hpc.plan.measure import UpdateStandIn

    def body(sub, n):
        stand = UpdateStandIn(cfg, rows[n])
        times = []
        update = 0
        for _ in range(blocks + 1):            # the first warms up
            t0 = time.perf_counter()
            for _ in range(stand.period):
                for phase in stand.phase_lists[update % len(stand.phase_lists)]:
                    size = stand.gradient(phase)
                    _reduce(sub, stand.send[:size + 3], stand.recv[:size + 3])
                    stand.apply(phase, size, 1.0 / n)
                update += 1
            times.append((time.perf_counter() - t0) / stand.period)
        return statistics.median(times[1:])

    return _over_members(comm, [n for n in counts if n in rows], order, body)


def _sync_probe_main() -> None:
    """`mpiexec -n N python -m mpi4py -m pal_hpc.plan --sync-probe COUNTS FLOATS [GANG]`:
    rank 0 prints {"sync": measure_sync's result, "gang": measure_gang's} as JSON;
    GANG is JSON {"argv": pal_hpc.main's flags, "rows": {L: rows}} (no gang without)."""
    from mpi4py import MPI

    counts = [int(c) for c in sys.argv[2].split(",") if c]
    floats = int(sys.argv[3])
    sync = measure_sync(MPI.COMM_WORLD, counts, floats)
    gang = {}
    if len(sys.argv) > 4:
        from pal_hpc.config_io import load_config

        spec = json.loads(sys.argv[4])
        gang = measure_gang(MPI.COMM_WORLD, counts, load_config(spec["argv"]),
                            {int(k): int(v) for k, v in spec["rows"].items()})
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps({"sync": {str(k): v for k, v in sync.items()},
                          "gang": {str(k): v for k, v in gang.items()}}), flush=True)


def measure_sync_here(counts: list[int], floats: int, argv: list[str] | None = None,
                      rows: dict[int, int] | None = None, ranks: int = 0,
                      timeout: float = 180.0) -> tuple[dict[int, float], dict[int, float]]:
    """measure_sync (and, given pal_hpc.main's flags `argv` and `rows`, measure_gang)
    in a helper mpiexec job of `ranks` ranks on this host (default: the most learners;
    the CLI gives the job's size, so the ranks that are not learners sleep-poll beside
    them as they will: with 4 ranks on 2 cores, g(3) came out 12 ms among 3 ranks and
    24 ms among 4, and the run took 20): ({L: r(L)}, {L: g(L)})."""
    from pal_hpc.cluster.launch import mpi_env, mpiexec

    if not counts:
        return {}, {}
    args = ["-m", "pal_hpc.plan", "--sync-probe", ",".join(map(str, counts)), str(floats)]
    if rows:
        args.append(json.dumps({"argv": list(argv or []),
                                "rows": {str(k): v for k, v in rows.items()}}))
    cmd = mpiexec(max(ranks, max(counts)), *args)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             env=mpi_env())
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the Allreduce probe ({' '.join(cmd)}) did not finish within "
                           f"{timeout:.0f} s") from None
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"the Allreduce probe failed (exit {out.returncode}): "
                           f"{(out.stderr or out.stdout)[-1500:]}")
    result = json.loads(lines[-1])
    return tuple({int(k): float(v) for k, v in result[key].items()}
                 for key in ("sync", "gang"))
