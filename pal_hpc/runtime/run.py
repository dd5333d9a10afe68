"""One training job: every rank builds what its role needs and runs one loop.

A rank is an actor, a learner, or both (a node of one rank).  Its loop never
blocks in MPI: the actor steps its environments, the learner advances its
state machine, the job-wide counters progress in the background, and a rank
with nothing to do sleeps for a millisecond instead of spinning (ranks often
outnumber cores here).  Rank 0 also prints progress, decides when to stop and
writes the summary.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

from pal_hpc.algos import ALGOS
from pal_hpc.config import config_to_dict
from pal_hpc.dist.topology import pick_device
from pal_hpc.dist.weights import WeightStore
from pal_hpc.replay import SharedReplay
from pal_hpc.runtime import stats as S
from pal_hpc.runtime.actor import Actor, evaluate
from pal_hpc.runtime.envs import make_env, obs_info
from pal_hpc.runtime.learner import Learner
from pal_hpc.runtime.nstep import transition_spec


def wait_all(comm: MPI.Comm, timeout: float = 600.0) -> None:
    """A barrier that sleeps instead of busy-polling."""
    req = comm.Ibarrier()
    deadline = time.monotonic() + timeout
    while not req.Test():
        if time.monotonic() > deadline:
            raise TimeoutError("barrier timed out: a rank is stuck")
        time.sleep(0.001)


class Coordinator:
    """Rank 0's view of the job: progress lines, evaluations, the stop decision."""

    def __init__(self, cfg, start: float):
        self.cfg = cfg
        self.start = start
        self.evals: list[dict] = []
        self.recent = deque(maxlen=100)         # (sum, count) of episode returns per round
        self.last_print = start
        self.last_steps = 0.0
        self.last_updates = 0.0
        self.target_hit: dict | None = None
        self.stop_reason = ""

    def observe(self, total: np.ndarray) -> bool:
        """Digest a completed round; True when the job should stop."""
        now = time.monotonic()
        if total[S.RETURN_COUNT] > 0:
            self.recent.append((total[S.RETURN_SUM], total[S.RETURN_COUNT]))
        if total[S.EVAL_COUNT] > 0:
            mean = total[S.EVAL_SUM] / total[S.EVAL_COUNT]
            rec = {"env_steps": int(total[S.EVAL_STEP]), "wall_s": round(now - self.start, 3),
                   "mean_return": float(mean), "episodes": int(total[S.EVAL_COUNT])}
            self.evals.append(rec)
            print(f"[{now - self.start:8.1f}s] eval  steps {rec['env_steps']:>9,}  "
                  f"greedy return {mean:8.1f} over {rec['episodes']} episodes", flush=True)
            if (self.cfg.target_return is not None and self.target_hit is None
                    and mean >= self.cfg.target_return):
                self.target_hit = rec
        if now - self.last_print >= self.cfg.progress_every:
            self.progress(total, now)
        if self.target_hit is not None:
            self.stop_reason = f"target return {self.cfg.target_return} reached"
        elif total[S.ENV_STEPS] >= self.cfg.total_steps:
            self.stop_reason = f"{self.cfg.total_steps} env steps done"
        elif self.cfg.wall_time > 0 and now - self.start >= self.cfg.wall_time:
            self.stop_reason = f"wall time {self.cfg.wall_time}s reached"
        return bool(self.stop_reason)

    def progress(self, total: np.ndarray, now: float) -> None:
        dt = max(now - self.last_print, 1e-9)
        steps, updates = total[S.ENV_STEPS], total[S.UPDATES]
        ret_sum = sum(s for s, _ in self.recent)
        ret_cnt = sum(c for _, c in self.recent)
        mean_ret = f"{ret_sum / ret_cnt:7.1f}" if ret_cnt else "      -"
        fill = total[S.REPLAY_SIZE] / max(total[S.REPLAY_CAPACITY], 1)
        print(f"[{now - self.start:8.1f}s] steps {steps:>9,.0f} ({(steps - self.last_steps) / dt:7,.0f}/s)"
              f"  episodes {total[S.EPISODES]:>6,.0f}  return {mean_ret}"
              f"  updates {updates:>8,.0f} ({(updates - self.last_updates) / dt:6,.0f}/s)"
              f"  replay {fill:4.0%}", flush=True)
        self.last_print, self.last_steps, self.last_updates = now, steps, updates


def _fault_injection(rank: int):
    """PAL_HPC_INJECT_FAULT="RANK:SECONDS" makes that rank raise after that long in the
    loop: how the tests prove that one failing rank ends the whole job."""
    spec = os.environ.get("PAL_HPC_INJECT_FAULT", "")
    if not spec:
        return None
    target, _, after = spec.partition(":")
    return float(after or 0) if int(target) == rank else None


def train(cfg, topo) -> dict | None:
    """Run the job on this rank; rank 0 returns the summary."""
    world, me = topo.world, topo.me
    torch.set_num_threads(cfg.torch_threads)
    probe = make_env(cfg.env, cfg.seed)
    obs_shape, obs_dtype = obs_info(probe)
    n_actions = int(probe.action_space.n)
    probe.close()

    node_roles = [r for r in topo.roles if r.node == me.node]
    node_actors = sum(r.is_actor for r in node_roles)
    node_learners = sum(r.is_learner for r in node_roles)
    n_actors = sum(r.is_actor for r in topo.roles)
    n_learners = sum(r.is_learner for r in topo.roles)
    replay = SharedReplay(transition_spec(obs_shape, obs_dtype), cfg.replay_capacity,
                          comm=topo.node, regions=node_actors, fanout=cfg.fanout,
                          alpha=cfg.per_alpha, eps=cfg.per_eps)
    Algo = ALGOS[cfg.algo]

    def make_algo(device):
        return Algo(obs_shape, n_actions, hidden=tuple(cfg.hidden), dueling=cfg.dueling,
                    double_q=cfg.double_q, gamma=cfg.gamma, n_step=cfg.n_step, lr=cfg.lr,
                    grad_clip=cfg.grad_clip, device=device, seed=cfg.seed)

    policy = make_algo("cpu")        # identical initial parameters on every rank (same seed)
    weights = WeightStore(policy.num_params, comm=topo.node)
    learner = actor = None
    if me.is_learner:
        device = pick_device(cfg.device, me.local_learner_index)
        algo = policy if (device.type == "cpu" and not me.is_actor) else make_algo(device)
        learner = Learner(cfg, algo, replay, topo.learners,
                          weights=weights if me.local_learner_index == 0 else None,
                          node_learners=node_learners)
    if me.is_actor:
        actor = Actor(cfg, policy, replay, me.local_actor_index, weights, me.actor_index, n_actors)
    evaluator = me.is_actor and me.actor_index == 0
    stats = S.StatsRounds(world)
    if me.local_rank == 0:          # one rank per node reports the node's replay
        stats.set(S.REPLAY_CAPACITY, replay.capacity)

    wait_all(world)
    start = time.monotonic()
    coord = Coordinator(cfg, start) if world.Get_rank() == 0 else None
    if coord:
        print(f"pal_hpc: {cfg.algo} on {cfg.env}: {world.Get_size()} ranks, {topo.n_nodes} node(s), "
              f"{n_actors} actors x {cfg.envs_per_actor} envs, {n_learners} learners; "
              f"replay {cfg.replay_capacity:,} per node ({replay.bytes_per_transition:.0f} B/transition)",
              flush=True)
    next_eval = cfg.eval_every if cfg.eval_every > 0 else float("inf")
    stop_asked = False
    fault_after = _fault_injection(world.Get_rank())
    steps_sent = 0          # this actor's steps included in the last completed round

    while True:
        if fault_after is not None and time.monotonic() - start > fault_after:
            raise RuntimeError(f"injected fault on rank {world.Get_rank()} (PAL_HPC_INJECT_FAULT)")
        did = False
        global_steps = stats.total[S.ENV_STEPS]
        if actor is not None and not stats.stopping and actor.may_insert() \
                and global_steps + (actor.steps - steps_sent) * n_actors < cfg.total_steps:
            actor.step(max(global_steps, actor.steps * n_actors))
            stats.set(S.ENV_STEPS, actor.steps)
            for ret, _ in actor.drain_episodes():
                stats.add(S.EPISODES, 1)
                stats.add(S.RETURN_SUM, ret)
                stats.add(S.RETURN_COUNT, 1)
            did = True
            if evaluator and global_steps >= next_eval and stats.mine[S.EVAL_COUNT] == 0:
                actor.pull_weights()
                returns = evaluate(cfg, policy, cfg.eval_episodes, seed=cfg.seed + 10**6 + int(global_steps))
                stats.add(S.EVAL_SUM, returns.sum())
                stats.add(S.EVAL_COUNT, len(returns))
                stats.add(S.EVAL_STEP, global_steps)
                next_eval = (global_steps // cfg.eval_every + 1) * cfg.eval_every
        if learner is not None:
            progress = min(1.0, global_steps / cfg.total_steps)
            did |= learner.step(stats.stopping, progress)
            if me.learner_index == 0:
                stats.set(S.UPDATES, learner.updates)
        if me.local_rank == 0:
            stats.set(S.REPLAY_SIZE, replay.size())
        if stats.poll():
            steps_sent = actor.steps if actor is not None else 0
            if coord is not None and not stop_asked and coord.observe(stats.total):
                stats.set(S.STOP, 1)
                stop_asked = True
        if stats.stopping and (learner is None or learner.done):
            break
        if not did:
            time.sleep(0.001)

    # Wind down: every learner has published its final weights once all ranks are here.
    if actor is not None:
        actor.flush()
    stats.finish()
    wait_all(world)
    final_eval = np.zeros(2)
    if evaluator:
        actor.pull_weights()
        returns = evaluate(cfg, policy, cfg.eval_episodes, seed=cfg.seed + 2 * 10**6)
        final_eval[:] = returns.sum(), len(returns)
    # Every learner must hold the same parameters: compare digests.
    digest = ""
    if learner is not None:
        digest = hashlib.sha256(learner.algo.get_flat_params().tobytes()).hexdigest()
    digests = [d for d in world.gather(digest, root=0) or [] if d]
    totals = np.zeros(S.SIZE)
    world.Reduce(stats.mine, totals, op=MPI.SUM, root=0)
    world.Reduce(final_eval.copy(), final_eval, op=MPI.SUM, root=0)
    wall = time.monotonic() - start
    summary = None
    if coord is not None:
        coord.observe(totals)           # episodes and evaluations since the last round
        final_mean = float(final_eval[0] / final_eval[1]) if final_eval[1] else None
        means = [e["mean_return"] for e in coord.evals] + ([final_mean] if final_mean is not None else [])
        hit = coord.target_hit
        if hit is None and final_mean is not None and cfg.target_return is not None \
                and final_mean >= cfg.target_return:
            hit = {"env_steps": int(totals[S.ENV_STEPS]), "wall_s": round(wall, 3)}
        summary = {
            "algo": cfg.algo, "env": cfg.env, "seed": cfg.seed,
            "env_steps": int(totals[S.ENV_STEPS]), "updates": int(totals[S.UPDATES]),
            "wall_s": round(wall, 3),
            "best_eval_return": max(means) if means else None,
            "final_eval_return": final_mean,
            "time_to_target_s": hit["wall_s"] if hit else None,
            "steps_to_target": hit["env_steps"] if hit else None,
            "target_return": cfg.target_return,
            "ranks": world.Get_size(), "nodes": topo.n_nodes,
            "actors": n_actors, "learners": n_learners,
            "learner_params_identical": len(set(digests)) == 1,
            "stop_reason": coord.stop_reason or "loop ended",
            "evaluations": coord.evals,
        }
        run_dir = Path(cfg.resolved_run_dir())
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(config_to_dict(cfg), indent=1))
        tmp = run_dir / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=1))
        os.replace(tmp, run_dir / "summary.json")
        short = {k: v for k, v in summary.items() if k != "evaluations"}
        print("summary: " + json.dumps(short), flush=True)
    if actor is not None:
        actor.close()
    wait_all(world)
    weights.free()
    replay.close()
    return summary

