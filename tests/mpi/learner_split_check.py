"""Run under mpiexec: every rank is a learner (the real Learner, SharedReplay and
Iallreduce, --learner-batch split, an uneven batch of 11).  After 4 updates of DQN,
TD3 and SAC, every learner's parameters equal one learner's updates on the union of
the rows all learners sampled (float tolerance), and the learners' digests agree.
With --per-weights batch the union's importance weights are divided by their largest
(one MAX reduction beside the gradient's sum); with buffer they are the replay's."""

import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # tests/: algo_checks

from algo_checks import make_split_algo, make_split_batch  # noqa: E402
from pal_hpc.config import Config  # noqa: E402
from pal_hpc.replay import SharedReplay  # noqa: E402
from pal_hpc.runtime.learner import Learner  # noqa: E402
from pal_hpc.runtime.nstep import transition_spec  # noqa: E402

BATCH, UPDATES = 11, 4


def check(world, name: str, per_weights: str) -> bool:
    discrete = name == "dqn"
    spec = transition_spec((3,), np.float32, () if discrete else (2,),
                           np.int64 if discrete else np.float32)
    replay = SharedReplay(spec, 512, comm=world, regions=1)
    if world.Get_rank() == 0:
        rows = make_split_batch(name, np.random.default_rng(7), 300)
        replay.add(0, {k: rows[k] for k in spec})
    world.Barrier()
    cfg = Config(algo=name, batch_size=BATCH, learning_starts=1, replay_ratio=1e6,
                 learner_batch="split", per_weights=per_weights)
    learner = Learner(cfg, make_split_algo(name), replay, world,
                      rng=np.random.default_rng([3, world.Get_rank()]))
    sampled = []
    sample = replay.sample
    replay.sample = lambda *a, **k: sampled.append(sample(*a, **k)) or sampled[-1]
    deadline = time.monotonic() + 60
    while learner.updates < UPDATES and time.monotonic() < deadline:
        if not learner.step(False, 0.5):
            time.sleep(1e-5)
    ok = learner.updates == UPDATES and all(len(b["weights"]) == learner.share for b in sampled)
    everyone = world.allgather(sampled)
    reference = make_split_algo(name)
    for u in range(UPDATES):
        union = {k: np.concatenate([rank_batches[u][k] for rank_batches in everyone])
                 for k in list(spec) + ["weights"]}
        if per_weights == "batch":
            union["weights"] = union["weights"] / union["weights"].max()
        for phase in reference.phases(u):
            out = np.zeros(reference.phase_size(phase), np.float32)
            reference.compute_gradients(phase, union, out)
            reference.apply_gradients(phase, out)
    for got, want in zip(learner.algo.state_arrays(), reference.state_arrays()):
        ok &= bool(np.allclose(got, want, rtol=1e-4, atol=1e-6))
    ok &= len(set(world.allgather(learner.algo.digest()))) == 1
    replay.close()
    return ok


def main():
    world = MPI.COMM_WORLD
    ok = True
    for name in ("dqn", "td3", "sac"):
        for per_weights in ("batch", "buffer"):
            mine = check(world, name, per_weights)
            if not mine:
                print(f"rank {world.Get_rank()}: {name} --per-weights {per_weights} differs",
                      flush=True)
            ok &= mine
    ok = world.allreduce(ok, op=MPI.LAND)
    if world.Get_rank() == 0:
        print(f"learners={world.Get_size()} ok={ok}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
