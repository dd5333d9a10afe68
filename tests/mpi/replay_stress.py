"""Run under mpiexec: writers and samplers hammer one SharedReplay in a node window.

Ranks 0..W-1 write (rank r into region r, in ring order); the other ranks sample
batches of 64 and update priorities with the tickets they got.  Every field of a
transition encodes the same (writer, sequence) stamp, so a sample whose fields
come from two writes (torn), a never-written slot, or a row in the wrong slot is
caught.  After the writers stop: stale tickets are dropped, total() is the exact
sum of the leaves, sampling matches p/sum (chi-square), and the write counters
agree with the writers.  Pass/fail is combined over all ranks.  With one rank,
that rank alternates writing and sampling.

    mpiexec -n 4 python -m mpi4py tests/mpi/replay_stress.py --writers 3 --seconds 3
"""

import argparse
import math
import sys
import time

import numpy as np
from mpi4py import MPI

from pal_hpc.cluster import node_comm
from pal_hpc.replay import SharedReplay

SPEC = {"obs": ((4,), np.float64), "action": ((), np.int64), "stamp": ((16,), np.uint8),
        "reward": ((), np.float32), "done": ((), np.bool_)}
BATCH = 64
CHI_DRAWS = 128_000
failures: list[str] = []


def fail(msg):
    failures.append(msg)


def wait_all(comm):
    """Barrier that sleeps instead of spinning: ranks outnumber the cores here."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.001)


def encode(w, seqs):
    """Rows for writer w, sequence numbers seqs; stamps start at 1 so zeros mean 'never written'."""
    ww = np.full(len(seqs), w + 1, np.int64)
    ss = np.asarray(seqs, np.int64) + 1
    check = ((ww * 7919 + ss * 104729) % 1_000_003).astype(np.float64)
    return {"obs": np.stack([ww, ss, ww * 1e6 + ss, check], axis=1).astype(np.float64),
            "action": (ww << 32) | ss,
            "stamp": np.stack([ww, ss], axis=1).astype("<i8").view(np.uint8).reshape(-1, 16),
            "reward": (ss % 4096).astype(np.float32),
            "done": ss % 7 == 0}


def check_rows(s, bounds, writes=None):
    """Torn / never-written / misplaced rows of sample `s`; with `writes`, also stale rows."""
    idx = s["indices"]
    blank = ~s["obs"].any(axis=1) & (s["action"] == 0) & ~s["stamp"].any(axis=1)
    for i in np.flatnonzero(blank):
        fail(f"never-written slot {idx[i]} sampled")
    ww = s["obs"][:, 0].astype(np.int64)
    ss = s["obs"][:, 1].astype(np.int64)
    for i in np.flatnonzero(~blank):
        w, seq = int(ww[i]) - 1, int(ss[i]) - 1
        if not (0 <= w < len(bounds) and seq >= 0):
            fail(f"torn read at slot {idx[i]}: obs stamp {s['obs'][i].tolist()} is no write")
            continue
        want = encode(w, [seq])
        bad = [k for k in want if not np.array_equal(s[k][i], want[k][0])]
        if bad:
            fail(f"torn read at slot {idx[i]}: fields {bad} disagree with obs stamp "
                 f"(writer {w}, seq {seq})")
            continue
        lo, hi = bounds[w]
        if idx[i] != lo + seq % (hi - lo):
            fail(f"slot {idx[i]} holds writer {w} seq {seq}, which belongs in {lo + seq % (hi - lo)}")
        if writes is not None and not writes[w] - (hi - lo) <= seq < writes[w]:
            fail(f"slot {idx[i]} holds stale writer {w} seq {seq} (writes={writes[w]})")
    wt = s["weights"]
    top = 1 + 1e-6 if writes is not None else np.inf   # p_min may move while sampling
    if not (np.isfinite(wt).all() and (wt > 0).all() and (wt <= top).all()):
        fail(f"weights outside (0, {top}]: {wt.min()}..{wt.max()}")


def chi_square_critical(dof, z=3.719):
    """Upper critical value of chi-square (Wilson-Hilferty), z=3.719 -> p = 1e-4."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--writers", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--self-test-tear", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    world = MPI.COMM_WORLD
    node = node_comm(world)
    rank, size = node.Get_rank(), node.Get_size()
    nw = args.writers
    if not (1 <= nw < size or size == nw == 1):
        if rank == 0:
            print(f"--writers must be in [1, {size - 1}] (or 1 on one rank), got {nw}")
        return 2
    samplers = list(range(nw, size)) if size > 1 else [0]
    is_writer, is_sampler = rank < nw, rank in samplers
    capacity = 251 * nw + 5                      # uneven split across regions on purpose
    rb = SharedReplay(SPEC, capacity, comm=node, regions=nw)
    bounds = [rb.region_slots(r) for r in range(nw)]
    rng = np.random.default_rng(1000 + rank)
    seq = samples = applied = 0
    tear_pending = args.self_test_tear and rank == samplers[0]

    def write(n):
        nonlocal seq
        lo, hi = bounds[rank]
        idx = rb.add(rank, encode(rank, seq + np.arange(n)))
        if not np.array_equal(idx, lo + (seq + np.arange(n)) % (hi - lo)):
            fail(f"add returned slots {idx.tolist()} for seq {seq}.. in region {bounds[rank]}")
        seq += n

    def sample_and_update():
        nonlocal samples, applied, tear_pending
        s = rb.sample(BATCH, beta=0.4, rng=rng)
        if tear_pending:                         # proves the checker can fail
            s["action"][0] += 1
            tear_pending = False
        check_rows(s, bounds)
        n = rb.update_priorities(s["indices"], rng.uniform(0.1, 2.0, BATCH), s["tickets"])
        if not 0 <= n <= BATCH:
            fail(f"update_priorities applied {n} of {BATCH}")
        samples += BATCH
        applied += n

    if is_writer:
        write(16)                                # so sampling never meets an empty buffer
    deadline = node.bcast(time.monotonic() + args.seconds if rank == 0 else None)
    wait_all(node)
    while time.monotonic() < deadline:
        if is_writer:
            write(int(rng.integers(1, 17)))
        if is_sampler:
            sample_and_update()
    wait_all(node)

    # (6) write counters against the writers' own counts; size from them.
    counts = [c for c in node.allgather(seq if is_writer else None) if c is not None]
    writes = [rb.writes(r) for r in range(nw)]
    if writes != counts:
        fail(f"writes() = {writes}, writers counted {counts}")
    want_size = sum(min(c, hi - lo) for c, (lo, hi) in zip(counts, bounds))
    if rb.size() != want_size:
        fail(f"size() = {rb.size()}, expected {want_size}")
    # (1, 2) at rest every sampled row is whole, in its slot, and the latest write there.
    for _ in range(8):
        check_rows(rb.sample(BATCH, rng=rng), bounds, writes)

    # (3) stale tickets: sample, let writer 0 rewrite part of region 0, then update.
    s = rb.sample(BATCH, rng=rng)
    idx, first = np.unique(s["indices"], return_index=True)
    tickets = s["tickets"][first]
    lo0, hi0 = bounds[0]
    k = (hi0 - lo0) // 2 + 1
    rewritten = lo0 + (writes[0] + np.arange(k)) % (hi0 - lo0)
    wait_all(node)
    if rank == 0:
        write(k)
    wait_all(node)
    stale = np.isin(idx, rewritten)
    for turn in samplers:
        if rank == turn:
            before = rb.priorities(idx)
            raw = rng.uniform(0.1, 2.0, idx.size)
            n = rb.update_priorities(idx, raw, tickets)
            after = rb.priorities(idx)
            if n != int((~stale).sum()):
                fail(f"stale tickets: {n} updates applied, expected {int((~stale).sum())} "
                     f"({int(stale.sum())} of {idx.size} slots were rewritten)")
            if not np.array_equal(after[stale], before[stale]):
                fail("an update with a stale ticket changed the priority")
            if not np.allclose(after[~stale], (raw[~stale] + 1e-6) ** 0.6, rtol=1e-6):
                fail("an update with a current ticket did not store (p+eps)**alpha")
        wait_all(node)

    # (4) total is the exact sum of the leaves.
    leaves = rb.priorities(np.arange(capacity)).astype(np.float64)
    exact = math.fsum(leaves)
    if not abs(rb.total() - exact) <= 1e-5 * exact:
        fail(f"total() = {rb.total()!r}, exact sum of leaves = {exact!r}")

    # (5) chi-square of sampling on the final buffer, draws split over the ranks.
    counts_local = np.zeros(capacity, np.int64)
    for _ in range(-(-CHI_DRAWS // (BATCH * size))):
        counts_local += np.bincount(rb.sample(BATCH, rng=rng)["indices"], minlength=capacity)
    wait_all(node)
    drawn = np.zeros(capacity, np.int64)
    node.Allreduce(counts_local, drawn, op=MPI.SUM)
    if rank == 0:
        pos = leaves > 0
        if drawn[~pos].any():
            fail(f"{int(drawn[~pos].sum())} draws of zero-priority slots")
        exp = leaves[pos] / leaves[pos].sum() * drawn.sum()
        stat = float(((drawn[pos] - exp) ** 2 / exp).sum())
        if not stat < chi_square_critical(int(pos.sum()) - 1):
            fail(f"chi-square {stat:.1f} over {int(pos.sum()) - 1} dof: sampling is not p/sum")

    for msg in failures[:5]:
        print(f"rank {rank}: {msg}", flush=True)
    ok = not failures
    ok_all = world.allreduce(ok, op=MPI.LAND)
    total_samples = world.allreduce(samples)
    total_applied = world.allreduce(applied)
    if world.Get_rank() == 0:
        print(f"ranks={world.Get_size()} writers={nw} samples={total_samples} "
              f"writes={sum(writes)} applied={total_applied} ok={ok_all}", flush=True)
    rb.close()
    node.Free()
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
