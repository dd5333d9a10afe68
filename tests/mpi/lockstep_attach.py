"""Run under mpiexec: LockstepVectorEnv.attach on the node's ranks.

Rank 0 is the master and steps the batch; the other ranks are workers in the node's
shared window.  The master checks every step against SyncVectorEnv with the same seeds
(bit for bit), including a partial reset; pass/fail is combined over all ranks.
argv[1], if given: the master's share (`master_envs`), the envs it steps itself.
argv[1] == "fail": the master's environment raises while it is built: rank 0 gets that
error and every worker a RuntimeError naming rank 0 (nobody waits for ever)."""

import sys

import gymnasium as gym
import numpy as np
from mpi4py import MPI

from pal_hpc.cluster import node_comm
from pal_hpc.envs.lockstep import LockstepVectorEnv

N_ENVS, STEPS = 7, 300


def make():
    return gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))


def broken():
    raise OSError("no such ROM")


def master_fails(world, node):
    rank = node.Get_rank()
    fns = [broken if rank == 0 else make] * N_ENVS      # the master's copy is what fails
    try:
        LockstepVectorEnv.attach(node, fns)
        ok = False
    except OSError as exc:
        ok = rank == 0 and "no such ROM" in str(exc)
    except RuntimeError as exc:
        ok = rank > 0 and "rank 0" in str(exc) and "no such ROM" in str(exc)
    ok_all = world.allreduce(ok, op=MPI.LAND)
    if world.Get_rank() == 0:
        print(f"ranks={world.Get_size()} ok={ok_all}")
    node.Free()
    return 0 if ok_all else 1


def main():
    world = MPI.COMM_WORLD
    node = node_comm(world)
    if len(sys.argv) > 1 and sys.argv[1] == "fail":
        return master_fails(world, node)
    share = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    env = LockstepVectorEnv.attach(node, [make] * N_ENVS, master_envs=share)
    ok = True
    if node.Get_rank() == 0:
        ref = gym.vector.SyncVectorEnv([make] * N_ENVS)
        o1, _ = env.reset(seed=5)
        o2, _ = ref.reset(seed=5)
        ok &= bool(np.array_equal(o1, o2))
        space = ref.action_space
        space.seed(5)
        ends = 0
        for t in range(STEPS):
            a = space.sample()
            r1, r2 = env.step(a), ref.step(a)
            ok &= all(np.array_equal(x, y) for x, y in zip(r1[:4], r2[:4]))
            ok &= bool(np.array_equal(r1[4].get("_episode", False), r2[4].get("_episode", False)))
            ends += int(r1[2].sum() + r1[3].sum())
            if t == 150:
                mask = np.zeros(N_ENVS, bool)
                mask[::2] = True
                o1, _ = env.reset(seed=9, options={"reset_mask": mask})
                o2, _ = ref.reset(seed=9, options={"reset_mask": mask.copy()})
                ok &= bool(np.array_equal(o1, o2))
        ok &= ends > 10
        ok &= len(env.worker_pids) == node.Get_size() - 1
        workers = node.Get_size() - 1
        ok &= env.master_envs == (share if workers else N_ENVS)
        lo = env._views.layout.ranges()[0][0] if workers else N_ENVS
        ok &= lo == env.master_envs            # the workers start after the share
        ok &= env.get_attr("np_random_seed") == ref.get_attr("np_random_seed")
        env.close()
        ref.close()
    else:
        ok &= env is None          # a worker returns once the master closed
    ok_all = world.allreduce(ok, op=MPI.LAND)
    if world.Get_rank() == 0:
        print(f"ranks={world.Get_size()} ok={ok_all}")
    node.Free()
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
