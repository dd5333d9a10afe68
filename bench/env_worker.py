"""One env-throughput run, launched by bench_envs.py under `mpiexec -n A`: every rank is
an actor and nothing else (no learner, no evaluation).

Each rank builds what pal_hpc/runtime/run.py builds for an actor rank -- a Config, a
node-shared SharedReplay with one region per actor of the node, a node WeightStore, the
DQN policy of its actor index (DQN(...).make_policy, hidden [64, 64]) and
pal_hpc.runtime.actor.Actor -- with eps_start = eps_final = 1.0, so every action is
random (the policy's forward pass still runs each step, as in a real actor).  After a --warmup and a barrier, each rank calls
Actor.step() for --seconds: it steps its --envs-per-actor environments, builds n-step
transitions and writes them into the shared replay in batches of 32 (Actor.flush), as a
training actor does, so the writes are part of what is timed.  The actor's rate limit
(Actor.may_insert) is not consulted: with no learner sampling it would stop the actor
after learning_starts transitions; the replay ring simply wraps.

Rank 0 prints one JSON line: aggregate env steps/s (sum of the ranks' own rates), the
per-rank rates, transitions written and episodes finished.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from mpi4py import MPI

from pal_hpc.algos.dqn import DQN, DQNConfig
from pal_hpc.config import Config
from pal_hpc.cluster import node_comm
from pal_hpc.cluster.weights import WeightStore
from pal_hpc.replay import SharedReplay
from pal_hpc.runtime.actor import Actor
from pal_hpc.envs import action_info, make_env, obs_info
from pal_hpc.runtime.nstep import transition_spec


def wait_all(comm) -> None:
    """A barrier that sleeps instead of busy-polling (ranks may outnumber cores)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.0005)


def run_for(actor: Actor, n_actors: int, seconds: float) -> tuple[int, int, float]:
    """Step the actor for `seconds`; (env steps, episodes finished, elapsed seconds)."""
    steps0, episodes = actor.steps, 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        actor.step(actor.steps * n_actors)
        episodes += len(actor.drain_episodes())
    actor.flush()
    return actor.steps - steps0, episodes, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=0.3, help="untimed seconds of stepping first")
    ap.add_argument("--envs-per-actor", type=int, default=8)
    ap.add_argument("--capacity", type=int, default=100_000, help="replay capacity per node")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    world = MPI.COMM_WORLD
    node = node_comm(world)
    n_actors = world.Get_size()
    cfg = Config(env=args.env, seed=args.seed, envs_per_actor=args.envs_per_actor,
                 replay_capacity=args.capacity,
                 algo_config=DQNConfig(eps_start=1.0, eps_final=1.0, hidden=[64, 64]))
    cfg.validate()
    torch.set_num_threads(cfg.torch_threads)
    probe = make_env(cfg.env, cfg.seed)
    obs_space, act_space = probe.observation_space, probe.action_space
    DQN.check_env(cfg.env, obs_space, act_space)
    spec = transition_spec(*obs_info(probe), *action_info(probe))
    probe.close()

    # As run.py: one replay region per actor rank of this node, one weight store per node.
    replay = SharedReplay(spec, cfg.replay_capacity, comm=node, regions=node.Get_size(),
                          fanout=cfg.fanout, alpha=cfg.per_alpha, eps=cfg.per_eps)
    algo = DQN(obs_space, act_space, cfg.algo_config, seed=cfg.seed)
    policy = algo.make_policy(world.Get_rank(), n_actors)
    weights = WeightStore(len(algo.policy_params()), comm=node)
    actor = Actor(cfg, policy, replay, node.Get_rank(), weights, world.Get_rank(), n_actors)

    run_for(actor, n_actors, args.warmup)
    wait_all(world)
    written0 = replay.writes(actor.region)          # this rank's own region
    steps, episodes, elapsed = run_for(actor, n_actors, args.seconds)
    written = replay.writes(actor.region) - written0
    wait_all(world)

    rows = world.gather((steps, episodes, elapsed, written), root=0)
    if world.Get_rank() == 0:
        rates = [s / e for s, _, e, _ in rows]
        print(json.dumps({
            "env": cfg.env, "actors": n_actors, "envs_per_actor": cfg.envs_per_actor,
            "seconds": args.seconds, "steps_per_s": float(np.sum(rates)),
            "per_rank_steps_per_s": rates, "env_steps": int(sum(r[0] for r in rows)),
            "episodes": int(sum(r[1] for r in rows)),
            "transitions_written": int(sum(r[3] for r in rows)),
            "elapsed_s": max(r[2] for r in rows),
            "bytes_per_transition": replay.bytes_per_transition,
        }), flush=True)
    wait_all(world)
    actor.close()
    weights.free()
    replay.close()
    node.Free()


if __name__ == "__main__":
    main()
