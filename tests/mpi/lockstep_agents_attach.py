"""Run under mpiexec: LockstepAgents.attach on the node's ranks.

Rank 0 holds the env and checks every gathered action against the policies evaluated
in-process (bit for bit); the other ranks evaluate their agents' policies in the node's
shared window.  argv[1]: the master's share (`master_agents`), or "raise": agent a4's
policy raises at its 3rd call, and rank 0 gets that ValueError with the worker's
traceback while every rank ends; "envfail": rank 0 cannot build the env, rank 0 gets
that error and every worker a RuntimeError naming rank 0 (nobody waits).  Pass/fail is combined over all ranks."""

import sys
from pathlib import Path

from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from test_lockstep_agents import Maker, Relay, _fns  # noqa: E402

from pal_hpc.cluster import node_comm  # noqa: E402
from pal_hpc.envs.lockstep_agents import LockstepAgents  # noqa: E402


def _broken():
    raise OSError("no such map")


def env_fails(world, node, fns):
    rank = node.Get_rank()
    try:
        LockstepAgents.attach(node, _broken if rank == 0 else Relay, fns)
        ok = False
    except OSError as exc:
        ok = rank == 0 and "no such map" in str(exc)
    except RuntimeError as exc:
        ok = rank > 0 and "rank 0" in str(exc) and "no such map" in str(exc)
    ok_all = world.allreduce(ok, op=MPI.LAND)
    if world.Get_rank() == 0:
        print(f"ranks={world.Get_size()} ok={ok_all}")
    node.Free()
    return 0 if ok_all else 1


def main():
    world = MPI.COMM_WORLD
    node = node_comm(world)
    mode = sys.argv[1] if len(sys.argv) > 1 else "0"
    fns = _fns(Relay(5))
    if mode == "raise":
        fns["a4"] = Maker(9, fail_at=3)
    if mode == "envfail":
        return env_fails(world, node, fns)
    runner = LockstepAgents.attach(node, lambda: Relay(5), fns,
                                   master_agents=0 if mode == "raise" else int(mode))
    ok = True
    if node.Get_rank() == 0:
        env = runner.env
        here = {a: fn() for a, fn in fns.items()}
        obs, _ = env.reset(seed=2)
        try:
            for _ in range(40):
                got = runner.act(obs)
                ok &= got == {a: here[a](obs[a]) for a in obs}
                obs, *_ = env.step(got)
            ok &= mode != "raise"
            ok &= runner.call("calls") == {a: 40 for a in env.possible_agents}
        except ValueError as exc:
            ok &= mode == "raise" and "policy broke at call 3" in str(exc) and \
                "agent 'a4'" in str(exc) and "Traceback" in str(exc)
        runner.close()
    else:
        ok &= runner is None
    ok_all = world.allreduce(ok, op=MPI.LAND)
    if world.Get_rank() == 0:
        print(f"ranks={world.Get_size()} ok={ok_all}")
    node.Free()
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
