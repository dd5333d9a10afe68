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


class RankRun:
    """What one rank builds for its role(s), its loop, and the wind-down."""

    def __init__(self, cfg, topo):
        self.cfg, self.topo = cfg, topo
        self.world, me = topo.world, topo.me
        self.me = me
        torch.set_num_threads(cfg.torch_threads)
        probe = make_env(cfg.env, cfg.seed)
        obs_shape, obs_dtype = obs_info(probe)
        n_actions = int(probe.action_space.n)
        probe.close()

        node_roles = [r for r in topo.roles if r.node == me.node]
        self.n_actors = sum(r.is_actor for r in topo.roles)
        self.n_learners = sum(r.is_learner for r in topo.roles)
        self.replay = SharedReplay(transition_spec(obs_shape, obs_dtype), cfg.replay_capacity,
                                   comm=topo.node, regions=sum(r.is_actor for r in node_roles),
                                   fanout=cfg.fanout, alpha=cfg.per_alpha, eps=cfg.per_eps)
        Algo = ALGOS[cfg.algo]

        def make_algo(device):
            return Algo(obs_shape, n_actions, hidden=tuple(cfg.hidden), dueling=cfg.dueling,
                        double_q=cfg.double_q, gamma=cfg.gamma, n_step=cfg.n_step, lr=cfg.lr,
                        grad_clip=cfg.grad_clip, device=device, seed=cfg.seed)

        # Same seed everywhere: every rank starts from identical parameters.
        self.policy = make_algo("cpu")
        self.weights = WeightStore(self.policy.num_params, comm=topo.node)
        self.learner = self.actor = None
        if me.is_learner:
            device = pick_device(cfg.device, me.local_learner_index)
            algo = self.policy if (device.type == "cpu" and not me.is_actor) else make_algo(device)
            self.learner = Learner(cfg, algo, self.replay, topo.learners,
                                   weights=self.weights if me.local_learner_index == 0 else None,
                                   node_learners=sum(r.is_learner for r in node_roles))
        if me.is_actor:
            self.actor = Actor(cfg, self.policy, self.replay, me.local_actor_index, self.weights,
                               me.actor_index, self.n_actors)
        self.evaluator = me.is_actor and me.actor_index == 0
        self.stats = S.StatsRounds(self.world)
        if me.local_rank == 0:          # one rank per node reports the node's replay
            self.stats.set(S.REPLAY_CAPACITY, self.replay.capacity)
        self.next_eval = cfg.eval_every if cfg.eval_every > 0 else float("inf")
        self.steps_sent = 0             # this actor's steps counted in the last round
        self.stop_asked = False
        self.coord = None
        self.start = 0.0

    # -- the loop ------------------------------------------------------------
    def run(self) -> dict | None:
        """Train until the job stops; rank 0 returns the summary."""
        wait_all(self.world)
        self.start = time.monotonic()
        if self.world.Get_rank() == 0:
            self.coord = Coordinator(self.cfg, self.start)
            self._announce()
        fault_after = _fault_injection(self.world.Get_rank())
        while True:
            if fault_after is not None and time.monotonic() - self.start > fault_after:
                raise RuntimeError(f"injected fault on rank {self.world.Get_rank()} "
                                   f"(PAL_HPC_INJECT_FAULT)")
            did = self._act() | self._learn()
            self._exchange()
            if self.stats.stopping and (self.learner is None or self.learner.done):
                break
            if not did:
                time.sleep(0.001)        # idle: give the core to a rank that has work
        return self._wind_down()

    def _act(self) -> bool:
        actor, stats, cfg = self.actor, self.stats, self.cfg
        if actor is None or stats.stopping or not actor.may_insert():
            return False
        global_steps = stats.total[S.ENV_STEPS]
        if global_steps + (actor.steps - self.steps_sent) * self.n_actors >= cfg.total_steps:
            return False                 # this actor's share of the budget is spent
        actor.step(max(global_steps, actor.steps * self.n_actors))
        stats.set(S.ENV_STEPS, actor.steps)
        for ret, _ in actor.drain_episodes():
            stats.add(S.EPISODES, 1)
            stats.add(S.RETURN_SUM, ret)
            stats.add(S.RETURN_COUNT, 1)
        if self.evaluator and global_steps >= self.next_eval and stats.mine[S.EVAL_COUNT] == 0:
            actor.pull_weights()
            returns = evaluate(cfg, self.policy, cfg.eval_episodes,
                               seed=cfg.seed + 10**6 + int(global_steps))
            stats.add(S.EVAL_SUM, returns.sum())
            stats.add(S.EVAL_COUNT, len(returns))
            stats.add(S.EVAL_STEP, global_steps)
            self.next_eval = (global_steps // cfg.eval_every + 1) * cfg.eval_every
        return True

    def _learn(self) -> bool:
        if self.learner is None:
            return False
        progress = min(1.0, self.stats.total[S.ENV_STEPS] / self.cfg.total_steps)
        did = self.learner.step(self.stats.stopping, progress)
        if self.me.learner_index == 0:
            self.stats.set(S.UPDATES, self.learner.updates)
        return did

    def _exchange(self) -> None:
        stats = self.stats
        if self.me.local_rank == 0:
            stats.set(S.REPLAY_SIZE, self.replay.size())
        if stats.poll():
            self.steps_sent = self.actor.steps if self.actor is not None else 0
            if self.coord is not None and not self.stop_asked and self.coord.observe(stats.total):
                stats.set(S.STOP, 1)
                self.stop_asked = True

    def _announce(self) -> None:
        cfg, topo = self.cfg, self.topo
        print(f"pal_hpc: {cfg.algo} on {cfg.env}: {self.world.Get_size()} ranks, "
              f"{topo.n_nodes} node(s), {self.n_actors} actors x {cfg.envs_per_actor} envs, "
              f"{self.n_learners} learners; replay {cfg.replay_capacity:,} per node "
              f"({self.replay.bytes_per_transition:.0f} B/transition)", flush=True)

    # -- the end ---------------------------------------------------------------
    def _wind_down(self) -> dict | None:
        world, cfg = self.world, self.cfg
        if self.actor is not None:
            self.actor.flush()
        self.stats.finish()
        wait_all(world)               # now every learner has published its final weights
        final_eval = np.zeros(2)
        if self.evaluator:
            self.actor.pull_weights()
            returns = evaluate(cfg, self.policy, cfg.eval_episodes, seed=cfg.seed + 2 * 10**6)
            final_eval[:] = returns.sum(), len(returns)
        digest = ""                   # every learner must hold the same parameters
        if self.learner is not None:
            digest = hashlib.sha256(self.learner.algo.get_flat_params().tobytes()).hexdigest()
        digests = [d for d in world.gather(digest, root=0) or [] if d]
        totals = np.zeros(S.SIZE)
        world.Reduce(self.stats.mine, totals, op=MPI.SUM, root=0)
        world.Reduce(final_eval.copy(), final_eval, op=MPI.SUM, root=0)
        summary = None
        if self.coord is not None:
            summary = self._summary(totals, final_eval, len(set(digests)) == 1)
        if self.actor is not None:
            self.actor.close()
        wait_all(world)
        self.weights.free()
        self.replay.close()
        return summary

    def _summary(self, totals: np.ndarray, final_eval: np.ndarray, identical: bool) -> dict:
        cfg, coord = self.cfg, self.coord
        wall = time.monotonic() - self.start
        coord.observe(totals)           # episodes and evaluations since the last round
        final_mean = float(final_eval[0] / final_eval[1]) if final_eval[1] else None
        means = [e["mean_return"] for e in coord.evals]
        means += [final_mean] if final_mean is not None else []
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
            "ranks": self.world.Get_size(), "nodes": self.topo.n_nodes,
            "actors": self.n_actors, "learners": self.n_learners,
            "learner_params_identical": identical,
            "stop_reason": coord.stop_reason or "loop ended",
            "evaluations": coord.evals,
        }
        run_dir = Path(cfg.resolved_run_dir())
        run_dir.mkdir(parents=True, exist_ok=True)
        _write_json(run_dir / "config.json", config_to_dict(cfg))
        _write_json(run_dir / "summary.json", summary)
        short = {k: v for k, v in summary.items() if k != "evaluations"}
        print("summary: " + json.dumps(short), flush=True)
        return summary


def _write_json(path: Path, obj) -> None:
    """Write via a temporary file and a rename, so a reader never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def train(cfg, topo) -> dict | None:
    """Run the job on this rank; rank 0 returns the summary."""
    return RankRun(cfg, topo).run()
