"""One replay benchmark run, launched by bench_replay.py under mpiexec.

Ranks 0..W-1 are writers (one region each), the last rank is the learner. For
`--seconds`, writers add batches of `--add-batch` transitions and the learner
samples `--batch` and updates their priorities.  Rank 0 prints one JSON line.
With --writers 0 the learner runs alone.  Rank 0 first fills `--prefill` of every
region (default: all of it), so the learner alone and the learner beside writers see
the same buffer -- full, as it is for most of a training run -- and the writers
overwrite the oldest slots in ring order.  --writer-rate paces each writer
(sleeping, not spinning) to a given insert rate.
"""

import argparse
import json
import time

import numpy as np
from mpi4py import MPI

from pal_hpc.cluster import node_comm
from pal_hpc.replay import SharedReplay
from pal_hpc.cluster.collectives import wait_all
from replay_data import SPECS, make_batch



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--writers", type=int, required=True)
    ap.add_argument("--capacity", type=int, default=1 << 20)
    ap.add_argument("--kind", choices=sorted(SPECS), default="cartpole")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--add-batch", type=int, default=64)
    ap.add_argument("--prefill", type=float, default=1.0,
                    help="fraction of every region rank 0 fills before the timed run")
    ap.add_argument("--writer-rate", type=float, default=0.0,
                    help="inserts/s each writer holds itself to (0: as fast as it can)")
    args = ap.parse_args()

    world = MPI.COMM_WORLD
    node = node_comm(world)
    rank, size = world.Get_rank(), world.Get_size()
    if size != args.writers + 1:
        raise SystemExit(f"need writers+1 = {args.writers + 1} ranks, got {size}")
    spec = SPECS[args.kind]
    regions = max(1, args.writers)
    rb = SharedReplay(spec, args.capacity, comm=node, regions=regions)
    rng = np.random.default_rng(rank)
    batch = make_batch(spec, args.add_batch, rng)
    is_learner = rank == size - 1

    if not 0.0 < args.prefill <= 1.0:
        raise SystemExit(f"--prefill must be in (0, 1], got {args.prefill}")
    if rank == 0:
        for r in range(regions):
            lo, hi = rb.region_slots(r)
            for _ in range(max(1, int((hi - lo) * args.prefill) // args.add_batch)):
                rb.add(r, batch)
    wait_all(world)

    count = 0
    t0 = time.perf_counter()
    deadline = t0 + args.seconds
    if is_learner:
        while time.perf_counter() < deadline:
            s = rb.sample(args.batch, beta=0.4, rng=rng)
            rb.update_priorities(s["indices"], rng.random(args.batch), s["tickets"])
            count += 1
    else:
        while (now := time.perf_counter()) < deadline:
            if args.writer_rate > 0 and count > args.writer_rate * (now - t0):
                # Ahead of the pace: sleep at least 0.5 ms, then catch up with several
                # adds in a row.  Sleeping just the (often microseconds) lead instead
                # woke each writer ~20k times/s; with 4 writers on 2 cores those
                # wake-ups alone took 45% of the learner's core (measured with
                # writers that only spin for an add's duration).
                time.sleep(max(5e-4, count / args.writer_rate - (now - t0)))
                continue
            rb.add(rank, batch)
            count += args.add_batch
    elapsed = time.perf_counter() - t0

    counts = world.gather((is_learner, count, elapsed), root=0)
    wait_all(world)
    if rank == 0:
        inserts = sum(c / e for learner, c, e in counts if not learner) if args.writers else 0.0
        cycles = sum(c / e for learner, c, e in counts if learner)
        print(json.dumps({"kind": args.kind, "writers": args.writers, "capacity": args.capacity,
                          "inserts_per_s": inserts, "learner_cycles_per_s": cycles,
                          "bytes_per_transition": rb.bytes_per_transition}), flush=True)
    rb.close()
    node.Free()


if __name__ == "__main__":
    main()
