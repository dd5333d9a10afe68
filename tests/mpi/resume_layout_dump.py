"""Resume a checkpoint on this job's layout and write down what every rank restored,
without training: run as

    mpiexec -n N python -m mpi4py tests/mpi/resume_layout_dump.py OUT pal_hpc flags...

(the flags include --resume PATH and --ranks-per-node).  Writes OUT/node<k>.h5 per node
(the replay's held rows: every field's bytes and the stored priority, for a plain
replay in slot order per region; for a frame replay each samplable slot's gathered
stacks and fields; its max priority, sample and insert counts, and a digest of the
whole buffer) and OUT/job.json from rank 0: whether every learner's algorithm state
(parameters, targets, optimizer) equals the checkpoint's bit for bit, the job's
counter sums, each actor's steps and the RNG states of every rank.

An on-policy checkpoint (--algo paac, ppo) has no replay: OUT/job.json alone, with
each master's algorithm state checked against the checkpoint's, its counters, env
steps and RNG states.
"""

import hashlib
import io
import json
import sys
from pathlib import Path

import h5py
import numpy as np
import torch
from mpi4py import MPI

from pal_hpc.algos import ALGOS
from pal_hpc.cluster.collectives import wait_all
from pal_hpc.cluster.topology import build_topology
from pal_hpc.config_io import load_config
from pal_hpc.io import checkpoint as ckpt
from pal_hpc.runtime.run import RankRun


def same_algo_state(algo, path: str) -> bool:
    """The algorithm's state_dict and the checkpoint's, stored the same way: equal
    checksums mean equal names, dtypes, shapes, bytes and JSON values."""
    def digest(fill):
        buf = io.BytesIO()
        with h5py.File(buf, "w") as f:
            fill(f)
            return ckpt.content_checksum(f)

    def mine(f):
        ckpt.save_tree(f.create_group("algo"), algo.state_dict())

    def saved(f):
        with h5py.File(path, "r") as src:
            src.copy(src["algo"], f, "algo")

    return digest(mine) == digest(saved)


def replay_rows(replay) -> dict:
    if hasattr(replay, "stack_name"):
        slots = np.flatnonzero(replay.priorities(np.arange(replay.capacity)) > 0)
        got = replay._gather(replay._core, slots)
        assert got["ok"].all()
        names = [replay.stack_name, *replay.small, replay.frames.next]
        rows = [b"".join(np.ascontiguousarray(got[n][i]).tobytes() for n in names)
                for i in range(slots.size)]
        prio = got["prio"]
    else:
        slots = np.concatenate([np.arange(a, a + min(replay.writes(r), b - a))
                                for r, (a, b) in enumerate(map(replay.region_slots,
                                                               range(replay.regions)))])
        rows = [b"".join(replay._columns[n][s].tobytes() for n in replay.spec)
                for s in slots.tolist()]
        prio = replay.priorities(slots)
    width = max((len(r) for r in rows), default=0)
    return {"rows": np.frombuffer(b"".join(rows), np.uint8).reshape(len(rows), width),
            "prio": np.asarray(prio, np.float32), "slots": slots.astype(np.int64)}


def main() -> None:
    out = Path(sys.argv[1])
    cfg = load_config(sys.argv[2:])
    world = MPI.COMM_WORLD
    topo = build_topology(world, cfg)
    if getattr(ALGOS[cfg.algo], "on_policy", False):
        return main_on_policy(out, cfg, world, topo)
    run = RankRun(cfg, topo)
    me = topo.me
    if me.local_rank == 0:
        rep = run.replay
        with h5py.File(out / f"node{me.node}.h5", "w") as f:
            for name, arr in replay_rows(rep).items():
                f.create_dataset(name, data=arr)
            f.attrs["max_priority"] = rep.max_priority()
            f.attrs["sampled"] = rep.sampled()
            f.attrs["inserted"] = rep.inserted()
            f.attrs["capacity"] = rep.capacity
            f.attrs["total"] = rep.total()
            f.attrs["state_digest"] = hashlib.sha256(rep.state_bytes().tobytes()).hexdigest()
    ok = True
    if run.learner is not None:
        ok = same_algo_state(run.learner.algo, run.resumed_from)
        with h5py.File(run.resumed_from, "r") as f:
            ok = ok and run.learner.updates == int(f.attrs["updates"])
    ok = world.allreduce(ok, op=MPI.LAND)
    totals = world.allreduce(run.stats.mine)
    mine = {"rank": world.Get_rank(),
            "actor_steps": run.actor.steps if run.actor is not None else None,
            "actor_rng": (json.dumps(run.actor.rng.bit_generator.state)
                          if run.actor is not None else None),
            "learner_rng": (json.dumps(run.learner.rng.bit_generator.state)
                            if run.learner is not None else None),
            # An actor rank with a numpy policy has no torch stream to restore.
            "torch_rng": (hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()
                          if run.uses_torch else None),
            "next_eval": run.next_eval}
    ranks = world.gather(mine, root=0)
    if world.Get_rank() == 0:
        (out / "job.json").write_text(json.dumps({
            "algo_state_equal": bool(ok), "totals": totals.tolist(), "ranks": ranks,
            "nodes": topo.n_nodes, "digest": run.start_digest}))
    wait_all(world)
    run.replay.close()
    run.weights.free()
    topo.free()


def main_on_policy(out: Path, cfg, world, topo) -> None:
    """The masters restore in OnPolicyRun's constructor; the workers hold nothing."""
    from pal_hpc.runtime.onpolicy.master import OnPolicyRun

    run = OnPolicyRun(cfg, topo)
    mine = {"rank": world.Get_rank(), "master": run.is_master}
    if run.is_master:
        with h5py.File(run.resumed_from, "r") as f:
            updates = int(f.attrs["updates"])
        mine.update(algo_state_equal=same_algo_state(run.algo, run.resumed_from)
                    and run.algo.updates == updates,
                    stats=run.stats.mine.tolist(), node_steps=run.node_steps,
                    rng=json.dumps(run.rng.bit_generator.state),
                    torch_rng=hashlib.sha256(torch.get_rng_state().numpy().tobytes()
                                             ).hexdigest(),
                    next_eval=run.next_eval, global_base=run.restored["global_base"],
                    evals=run.restored["evals"], digest=run.start_digest)
    ranks = world.gather(mine, root=0)
    if world.Get_rank() == 0:
        (out / "job.json").write_text(json.dumps({"ranks": ranks, "nodes": topo.n_nodes}))
    wait_all(world)
    if run.run_dir_lock is not None:
        run.run_dir_lock.release()
    topo.free()


if __name__ == "__main__":
    main()
