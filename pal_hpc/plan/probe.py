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


def burn_cpu(seconds: float) -> None:
    """Compute (spin) until this process has used `seconds` more CPU time: a stand-in
    for a learner's gradient work that competes for the cores as that work does."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


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


def measure_gang(comm, counts: list[int], floats: int, work_s: dict[int, float],
                 phases: list[int], order: list[int] | None = None,
                 blocks: int = 4) -> dict[int, float]:
    """Collective over `comm`: the wall seconds per update of L learners working at
    once where the roles will put them -- each burns `work_s[L]` CPU-seconds per update
    (a learner's u on its share, split evenly over the update's phases) and ends each
    phase with an Iallreduce of `floats` float32 polled as a learner polls it; updates
    follow `phases` (phases per successive update, e.g. TD3's [1, 2]).  It holds what
    u and r(L) measured apart miss: L learners on fewer free cores finish a phase one
    after another (the phase ends at the last one's gradient), and a reduction waits
    for a member that is not running.  Returns {L: the slowest member's median over
    `blocks` blocks of len(phases) updates} on rank 0; {} elsewhere."""
    send = np.ones(floats + 3, np.float32)
    recv = np.empty_like(send)
    mean_phases = float(np.mean(phases))

    def body(sub, n):
        per_phase = work_s[n] / mean_phases
        times = []
        for _ in range(blocks + 1):            # the first warms up
            t0 = time.perf_counter()
            for count in phases:
                for _ in range(count):
                    burn_cpu(per_phase)
                    _reduce(sub, send, recv)
            times.append((time.perf_counter() - t0) / len(phases))
        return statistics.median(times[1:])

    return _over_members(comm, [n for n in counts if n in work_s], order, body)


def _sync_probe_main() -> None:
    """`mpiexec -n N python -m mpi4py -m pal_hpc.plan --sync-probe COUNTS FLOATS [GANG]`:
    rank 0 prints {"sync": measure_sync's result, "gang": measure_gang's} as JSON;
    GANG is JSON {"work": {L: seconds}, "phases": [...]} (no gang measurement without)."""
    from mpi4py import MPI

    counts = [int(c) for c in sys.argv[2].split(",") if c]
    floats = int(sys.argv[3])
    sync = measure_sync(MPI.COMM_WORLD, counts, floats)
    gang = {}
    if len(sys.argv) > 4:
        spec = json.loads(sys.argv[4])
        gang = measure_gang(MPI.COMM_WORLD, counts, floats,
                            {int(k): float(v) for k, v in spec["work"].items()},
                            [int(c) for c in spec["phases"]])
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps({"sync": {str(k): v for k, v in sync.items()},
                          "gang": {str(k): v for k, v in gang.items()}}), flush=True)


def measure_sync_here(counts: list[int], floats: int, work_s: dict[int, float] | None = None,
                      phases: list[int] | None = None, timeout: float = 120.0
                      ) -> tuple[dict[int, float], dict[int, float]]:
    """measure_sync (and, given `work_s`, measure_gang) in a helper mpiexec job on this
    host (the CLI runs outside MPI): ({L: r(L)}, {L: gang seconds per update})."""
    from pal_hpc.cluster.launch import mpi_env, mpiexec

    if not counts:
        return {}, {}
    args = ["-m", "pal_hpc.plan", "--sync-probe", ",".join(map(str, counts)), str(floats)]
    if work_s:
        args.append(json.dumps({"work": {str(k): v for k, v in work_s.items()},
                                "phases": list(phases or [1])}))
    cmd = mpiexec(max(counts), *args)
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
