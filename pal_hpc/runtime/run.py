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
import secrets
import sys
import warnings
import os
import time
from collections import deque
from pathlib import Path

import h5py
import numpy as np
import torch
from mpi4py import MPI

from pal_hpc.algos import ALGOS
from pal_hpc.config import ConfigError, config_to_dict
from pal_hpc.io import checkpoint as ckpt
from pal_hpc.io.rundir import claim_run_dir
from pal_hpc.cluster.topology import pick_device
from pal_hpc.cluster.weights import WeightStore
from pal_hpc.replay import SharedReplay
from pal_hpc.runtime import signals
from pal_hpc.runtime.abort import JobError
from pal_hpc.runtime import stats as S
from pal_hpc.runtime.actor import Actor, evaluate
from pal_hpc.runtime.envs import make_env, obs_info
from pal_hpc.runtime.learner import METRICS_EVERY, Learner
from pal_hpc.runtime.nstep import transition_spec
from pal_hpc.runtime.telemetry import Telemetry, percentile_ms, rss_mb
from pal_hpc.io.metrics import log_segments, open_run_log, run_attributes
from pal_hpc.io.schema import EVALUATION


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

    def __init__(self, cfg, start: float, evals: list | None = None, telemetry=None):
        self.cfg = cfg
        self.telemetry = telemetry
        self.start = start
        self.evals: list[dict] = list(evals or [])
        self.recent = deque(maxlen=100)         # (sum, count) of episode returns per round
        self.last_print = start
        self.last_steps = 0.0
        self.last_updates = 0.0
        self.target_hit: dict | None = None
        self.stop_reason = ""
        self.last_checkpoint = start

    def checkpoint_due(self) -> bool:
        """True when --checkpoint-every seconds have passed since the last checkpoint."""
        every = self.cfg.checkpoint_every
        if every > 0 and time.monotonic() - self.last_checkpoint >= every:
            self.last_checkpoint = time.monotonic()
            return True
        return False

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
            if self.telemetry is not None:
                var = max(total[S.EVAL_SUMSQ] / total[S.EVAL_COUNT] - mean * mean, 0.0)
                self.telemetry.record("evaluation", (rec["env_steps"], rec["wall_s"], mean,
                                                     var ** 0.5, rec["episodes"]))
            print(f"[{now - self.start:8.1f}s] eval  steps {rec['env_steps']:>9,}  "
                  f"greedy return {mean:8.1f} over {rec['episodes']} episodes", flush=True)
            if (self.cfg.target_return is not None and self.target_hit is None
                    and mean >= self.cfg.target_return):
                self.target_hit = rec
        if now - self.last_print >= self.cfg.progress_every:
            self.progress(total, now)
        if total[S.PREEMPT] > 0:
            self.stop_reason = (f"{signals.requested or 'SIGTERM/SIGUSR1/SIGINT'}: "
                                f"checkpoint and exit")
        elif self.target_hit is not None:
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
        # Before anything is allocated: the run directory is writable, not another
        # run's, and this job's alone (rank 0 holds its lock until the process ends).
        self.run_dir_lock = _on_rank0(self.world, lambda: claim_run_dir(
            cfg.resolved_run_dir(), cfg.resume, cfg.overwrite))
        torch.set_num_threads(cfg.torch_threads)
        # Adam's second moments of small gradients decay into float32 denormals, and
        # x86 arithmetic on denormals is ~50x slower: it made the optimizer step the
        # learner's biggest cost.  Flush them to zero (FTZ/DAZ; values < 1.2e-38).
        torch.set_flush_denormal(True)
        probe = make_env(cfg.env, cfg.seed)
        obs_shape, obs_dtype = obs_info(probe)
        n_actions = int(probe.action_space.n)
        probe.close()

        node_roles = [r for r in topo.roles if r.node == me.node]
        self.n_actors = sum(r.is_actor for r in topo.roles)
        self.n_learners = sum(r.is_learner for r in topo.roles)
        spec = transition_spec(obs_shape, obs_dtype)
        regions = sum(r.is_actor for r in node_roles)
        check_replay_fits(self.world, topo.node, spec, cfg, regions)
        self.replay = SharedReplay(spec, cfg.replay_capacity, comm=topo.node, regions=regions,
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
                                   node_learners=sum(r.is_learner for r in node_roles),
                                   # Each learner samples its own stream, reproducibly.
                                   rng=np.random.default_rng([cfg.seed, 1, me.learner_index]))
        if me.is_actor:
            self.actor = Actor(cfg, self.policy, self.replay, me.local_actor_index, self.weights,
                               me.actor_index, self.n_actors)
        self.evaluator = me.is_actor and me.actor_index == 0
        self.stats = S.StatsRounds(self.world)
        if me.local_rank == 0:          # one rank per node reports the node's replay
            self.stats.set(S.REPLAY_CAPACITY, self.replay.capacity)
        self.next_eval = cfg.eval_every if cfg.eval_every > 0 else float("inf")
        self.steps_sent = 0             # this actor's steps counted in the last round
        self.checkpoints_done = 0       # mid-run checkpoints this rank took part in
        self.hosts = self.world.gather(MPI.Get_processor_name(), root=0)
        self.telemetry = Telemetry(self.world.Dup())
        self._sys_last = (time.monotonic(), 0, 0)
        self.ckpt_comm = self.world.Dup()   # checkpoint collectives never meet a stats round
        self.stop_asked = False
        self.coord = None
        self.start = 0.0
        self.restored: dict = {}        # wall time and evaluations of the run we resume
        self.pruner = ckpt.Pruner(cfg.resolved_run_dir(), cfg.keep_checkpoints)
        self.last_good = ""             # rank 0: the newest checkpoint known to verify
        self.resumed_from = ""
        self.start_digest = ""
        if cfg.resume:
            self._resume()
        if self.learner is not None:
            self.start_digest = _digest(self.learner.algo)
        self.start_replay_size = self.replay.size()

    # -- the loop ------------------------------------------------------------
    def run(self) -> dict | None:
        """Train until the job stops; rank 0 returns the summary."""
        wait_all(self.world)
        self.start = time.monotonic() - self.restored.get("wall_s", 0.0)
        if self.world.Get_rank() == 0:
            self.telemetry.log = self._open_log()
            self.coord = Coordinator(self.cfg, self.start, self.restored.get("evals"),
                                     self.telemetry)
            self._announce()
        fault_after = _fault_injection(self.world.Get_rank())
        while True:
            if fault_after is not None and time.monotonic() - self.start > fault_after:
                raise RuntimeError(f"injected fault on rank {self.world.Get_rank()} "
                                   f"(PAL_HPC_INJECT_FAULT)")
            did = self._act() | self._learn()
            self._exchange()
            self._system_row()
            self.telemetry.poll()
            if self._checkpoint_pending() and (self.learner is None or self.learner.paused):
                self._checkpoint(self._totals())
                self.checkpoints_done += 1
                if self.learner is not None:
                    self.learner.paused = False
                did = True
            if self.stats.stopping and (self.learner is None or self.learner.done):
                break
            if not did:
                time.sleep(0.001)        # idle: give the core to a rank that has work
        return self._wind_down()

    def _checkpoint_pending(self) -> bool:
        """Rank 0 asked for a mid-run checkpoint that this rank has not taken yet."""
        return (not self.stats.stopping
                and self.stats.total[S.CHECKPOINTS] > self.checkpoints_done)

    def _totals(self) -> np.ndarray:
        totals = np.zeros(S.SIZE)
        self.ckpt_comm.Allreduce(self.stats.mine, totals, op=MPI.SUM)
        return totals

    def _act(self) -> bool:
        actor, stats, cfg = self.actor, self.stats, self.cfg
        if actor is None or stats.stopping or not actor.may_insert():
            return False
        if self._checkpoint_pending():
            actor.flush()               # pause: the checkpoint needs a quiet buffer
            return False
        global_steps = stats.total[S.ENV_STEPS]
        if global_steps + (actor.steps - self.steps_sent) * self.n_actors >= cfg.total_steps:
            return False                 # this actor's share of the budget is spent
        actor.step(max(global_steps, actor.steps * self.n_actors))
        stats.set(S.ENV_STEPS, actor.steps)
        now = time.monotonic() - self.start
        for ret, length in actor.drain_episodes():
            stats.add(S.EPISODES, 1)
            stats.add(S.RETURN_SUM, ret)
            stats.add(S.RETURN_COUNT, 1)
            self.telemetry.record("episodes", (int(max(global_steps, actor.steps * self.n_actors)),
                                               now, self.me.actor_index, ret, length))
        if self.evaluator and global_steps >= self.next_eval and stats.mine[S.EVAL_COUNT] == 0:
            actor.pull_weights()
            returns = evaluate(cfg, self.policy, cfg.eval_episodes,
                               seed=cfg.seed + 10**6 + int(global_steps))
            stats.add(S.EVAL_SUM, returns.sum())
            stats.add(S.EVAL_SUMSQ, (returns ** 2).sum())
            stats.add(S.EVAL_COUNT, len(returns))
            stats.add(S.EVAL_STEP, global_steps)
            self.next_eval = (global_steps // cfg.eval_every + 1) * cfg.eval_every
        return True

    def _learn(self) -> bool:
        if self.learner is None:
            return False
        progress = min(1.0, self.stats.total[S.ENV_STEPS] / self.cfg.total_steps)
        before = self.learner.updates
        did = self.learner.step(self.stats.stopping, progress, pause=self._checkpoint_pending())
        if self.me.learner_index == 0:
            self.stats.set(S.UPDATES, self.learner.updates)
            u = self.learner.updates
            if u != before and u % METRICS_EVERY == 0 and self.learner.metrics:
                m = self.learner.metrics
                self.telemetry.record("learner", (
                    u, time.monotonic() - self.start, int(self.stats.total[S.ENV_STEPS]),
                    m.get("loss", np.nan), m.get("td_abs_mean", np.nan), m.get("q_mean", np.nan),
                    m.get("grad_norm", np.nan), self.cfg.lr))
        return did

    def _exchange(self) -> None:
        stats = self.stats
        if signals.requested and not stats.mine[S.PREEMPT]:
            stats.set(S.PREEMPT, 1)     # checkpoint at the next safe point, then exit 0
        if self.me.local_rank == 0:
            stats.set(S.REPLAY_SIZE, self.replay.size())
        if stats.poll():
            self.steps_sent = self.actor.steps if self.actor is not None else 0
            if self.coord is not None and not self.stop_asked and self.coord.observe(stats.total):
                stats.set(S.STOP, 1)
                self.stop_asked = True
            elif self.coord is not None and not self.stop_asked and self.coord.checkpoint_due():
                stats.add(S.CHECKPOINTS, 1)

    def _open_log(self):
        cfg, topo = self.cfg, self.topo
        layout = {"ranks": self.world.Get_size(), "nodes": topo.n_nodes,
                  "actors": self.n_actors, "learners": self.n_learners,
                  "roles": [[r.rank, r.node, int(r.is_actor), int(r.is_learner)] for r in topo.roles]}
        attrs = run_attributes(config_to_dict(cfg), layout, self.hosts,
                               MPI.Get_library_version().strip())
        if self.resumed_from:         # what a reader drops of a killed run's last rows
            attrs["resumed_at_wall_s"] = self.restored["wall_s"]
        run_dir = Path(cfg.resolved_run_dir())
        old = log_segments(run_dir)
        if old and not self.resumed_from:
            # --resume auto found no checkpoint: the log is of an attempt that died before
            # its first one.  Keep it, out of the way of this run's log.
            aside = run_dir / f"abandoned-{time.strftime('%Y%m%d-%H%M%S')}"
            aside.mkdir()
            for path in old:
                os.replace(path, aside / path.name)
            print(f"pal_hpc: no checkpoint to resume; the earlier attempt's metrics log "
                  f"moved to {aside}", flush=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            log = open_run_log(run_dir, attrs, resume=bool(self.resumed_from))
        for w in caught:
            print(f"pal_hpc: warning: {w.message}", flush=True)
        return log

    def _system_row(self, force: bool = False) -> None:
        """About every 2 s (and once at the end): this rank's throughput, replay fill,
        latencies and memory."""
        now = time.monotonic()
        last, steps0, updates0 = self._sys_last
        if now - last < 2.0 and not force:
            return
        steps = self.actor.steps if self.actor is not None else 0
        updates = self.learner.updates if self.learner is not None else 0
        ins = self.actor.insert_times if self.actor is not None else []
        smp = self.learner.sample_times if self.learner is not None else []
        role = (1 if self.me.is_actor else 0) + (2 if self.me.is_learner else 0)
        self.telemetry.record("system", (
            now - self.start, self.world.Get_rank(), role, (steps - steps0) / (now - last),
            (updates - updates0) / (now - last), self.replay.size() / self.replay.capacity,
            percentile_ms(smp, 50), percentile_ms(smp, 99), percentile_ms(ins, 50),
            percentile_ms(ins, 99), rss_mb()))
        ins.clear()
        smp.clear()
        self._sys_last = (now, steps, updates)

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
        self._system_row(force=True)
        self.telemetry.close()
        self.stats.finish()
        wait_all(world)               # now every learner has published its final weights
        final_eval = np.zeros(2)
        if self.evaluator:
            self.actor.pull_weights()
            returns = evaluate(cfg, self.policy, cfg.eval_episodes, seed=cfg.seed + 2 * 10**6)
            final_eval[:] = returns.sum(), len(returns)
        # Every learner must hold the same parameters: compare digests.
        digest = _digest(self.learner.algo) if self.learner is not None else ""
        digests = [d for d in world.gather(digest, root=0) or [] if d]
        totals = np.zeros(S.SIZE)
        world.Reduce(self.stats.mine, totals, op=MPI.SUM, root=0)
        world.Reduce(final_eval.copy(), final_eval, op=MPI.SUM, root=0)
        checkpoint = self._checkpoint(totals)
        summary = None
        if self.coord is not None:
            summary = self._summary(totals, final_eval, len(set(digests)) == 1, checkpoint)
        if self.actor is not None:
            self.actor.close()
        wait_all(world)
        self.telemetry.close_log()
        self.telemetry.comm.Free()
        self.weights.free()
        self.replay.close()
        self.ckpt_comm.Free()
        if self.run_dir_lock is not None:
            self.run_dir_lock.release()
        if checkpoint is None:
            raise JobError(f"the final checkpoint could not be written (see the error "
                           f"above); the newest checkpoint on disk is "
                           f"{world.bcast(self.last_good, root=0) or 'none'}")
        return summary

    def _summary(self, totals: np.ndarray, final_eval: np.ndarray, identical: bool,
                 checkpoint: str) -> dict:
        cfg, coord = self.cfg, self.coord
        wall = time.monotonic() - self.start
        coord.observe(totals)           # episodes and evaluations since the last round
        final_mean = float(final_eval[0] / final_eval[1]) if final_eval[1] else None
        if final_mean is not None:
            self.telemetry.write_now("evaluation", np.array(
                [(int(totals[S.ENV_STEPS]), wall, final_mean, np.nan, int(final_eval[1]))],
                dtype=EVALUATION))
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
            "checkpoint": checkpoint,       # None: the final checkpoint failed
            "resumed_from": self.resumed_from or None,
            "params_digest_at_start": self.start_digest or None,
            "replay_size_at_start": self.start_replay_size,
            "stop_reason": coord.stop_reason or "loop ended",
            "evaluations": coord.evals,
        }
        run_dir = Path(cfg.resolved_run_dir())
        _write_json(run_dir / "config.json", config_to_dict(cfg))
        _write_json(run_dir / "summary.json", summary)
        short = {k: v for k, v in summary.items() if k != "evaluations"}
        print("summary: " + json.dumps(short), flush=True)
        return summary


    # -- checkpoints -------------------------------------------------------------
    def _checkpoint(self, totals: np.ndarray) -> str | None:
        """Collective over every rank, at a safe point (learners paused after the same
        step, actors between steps): replay files by each node's first rank, then the
        main file by rank 0.  Returns the main file's path on every rank, or None when
        a file could not be written: that is reported, what was written of this
        checkpoint is removed, and the previous checkpoint stays the newest."""
        cfg, world, me = self.cfg, self.ckpt_comm, self.me
        wait_all(world)               # nobody on the node touches the replay from here on
        step = self.learner.updates if self.learner is not None else 0
        # A new tag per checkpoint: rewriting step N never replaces the replay files
        # an existing step_N.h5 verifies against.
        step, tag = world.bcast((step, secrets.token_hex(4)), root=0)
        main = ckpt.main_path(cfg.resolved_run_dir(), step)
        replay_file = ("", "", "")    # (name, checksum, error)
        if cfg.checkpoint_replay and me.local_rank == 0:
            path = ckpt.replay_path(main, me.node, tag)
            state = self.replay.state_arrays()
            try:
                replay_file = (path.name, ckpt.write_atomic(
                    path, lambda f: self._fill_replay(f, state),
                    expected_bytes=sum(a.nbytes for a in state.values())), "")
            except OSError as exc:
                replay_file = ("", "", f"node {me.node}'s replay: {exc}")
        gathered = world.gather((self._rank_state(), replay_file), root=0)
        written = None
        if world.Get_rank() == 0:
            errors = [err for _, (_, _, err) in gathered if err]
            replay_files = {name: digest for _, (name, digest, _) in gathered if name}
            if not errors:
                try:
                    self._write_main(main, step, totals, [s for s, _ in gathered], replay_files)
                    written = str(main)
                except OSError as exc:
                    errors.append(str(exc))
            if written:
                self._after_checkpoint(main)
            else:
                for name in replay_files:
                    main.with_name(name).unlink(missing_ok=True)
                print(f"pal_hpc: error: checkpoint at update {step} not written: "
                      f"{'; '.join(errors)}; the newest checkpoint is still "
                      f"{self.last_good or 'none'}", file=sys.stderr, flush=True)
        written = world.bcast(written, root=0)
        wait_all(world)
        return written

    def _after_checkpoint(self, main: Path) -> None:
        """Rank 0: note the new checkpoint and prune (a failure here costs no checkpoint)."""
        self.last_good = str(main)
        self.pruner.mark_good(main)
        try:
            for note in self.pruner.prune():
                print(f"pal_hpc: {note}", flush=True)
        except OSError as exc:
            print(f"pal_hpc: warning: pruning checkpoints failed: {exc}", file=sys.stderr,
                  flush=True)

    def _fill_replay(self, f: h5py.File, state: dict) -> None:
        """A node's replay file: the buffer's signature and its written rows only."""
        f.attrs["format"] = ckpt.FORMAT_VERSION
        f.attrs["signature"] = json.dumps(self.replay.signature())
        group = f.create_group("replay")
        for name, arr in state.items():
            group.create_dataset(name, data=arr, chunks=True if arr.size else None)

    def _rank_state(self) -> dict:
        actor = self.actor
        return {
            "rank": self.world.Get_rank(),
            "actor_steps": actor.steps if actor is not None else 0,
            "stats": self.stats.mine.tolist(),
            "np_rng": json.dumps(actor.rng.bit_generator.state) if actor is not None else "",
            "learner_rng": (json.dumps(self.learner.rng.bit_generator.state)
                            if self.learner is not None else ""),
            "torch_rng": torch.get_rng_state().numpy(),
            "next_eval": float(self.next_eval),
        }

    def _write_main(self, main: Path, step: int, totals, states: list, replay_files: dict) -> None:
        cfg, learner = self.cfg, self.learner
        layout = [[r.node, r.is_actor, r.is_learner] for r in self.topo.roles]
        evals = self.coord.evals if self.coord is not None else []

        def fill(f):
            a = f.attrs
            a["format"] = ckpt.FORMAT_VERSION
            a["updates"] = step
            a["env_steps"] = int(totals[S.ENV_STEPS])
            a["wall_s"] = time.monotonic() - self.start
            a["config"] = json.dumps(config_to_dict(cfg))
            a["layout"] = json.dumps(layout)
            a["evals"] = json.dumps(evals)
            a["replay_files"] = json.dumps(replay_files)
            a["params_digest"] = _digest(learner.algo)
            ckpt.save_tree(f.create_group("algo"), learner.algo.state_dict())
            ranks = f.create_group("ranks")
            for st in states:
                g = ranks.create_group(f"rank_{st['rank']}")
                g.create_dataset("torch_rng", data=st["torch_rng"])
                g.attrs["actor_steps"] = st["actor_steps"]
                g.attrs["stats"] = json.dumps(st["stats"])
                g.attrs["np_rng"] = st["np_rng"]
                g.attrs["learner_rng"] = st["learner_rng"]
                g.attrs["next_eval"] = st["next_eval"]
        ckpt.write_atomic(main, fill, in_memory=True)     # networks + optimizer: tens of MB at most

    def _resume(self) -> None:
        """Restore parameters, optimizer, counters, RNG states and replay buffers."""
        cfg, world, me = self.cfg, self.world, self.me
        found = _on_rank0(world, self._find_checkpoint)
        found = world.bcast(found, root=0)
        if found is None:
            return
        with h5py.File(found, "r") as f:
            self._check_fits(f.attrs)
            if self.learner is not None:
                self.learner.algo.load_state_dict(ckpt.load_tree(f["algo"]))
                self.learner.updates = int(f.attrs["updates"])
                if self.learner.weights is not None:
                    self.learner.weights.publish(self.learner.algo.get_flat_params())
            g = f[f"ranks/rank_{world.Get_rank()}"]
            self.stats.mine[:] = json.loads(g.attrs["stats"])[:S.SIZE]
            # Requests of the old run (stop, preemption, checkpoints) are not this run's.
            for slot in (S.PREEMPT, S.STOP, S.CHECKPOINTS):
                self.stats.mine[slot] = 0.0
            torch.set_rng_state(torch.from_numpy(np.array(g["torch_rng"][()])))
            if self.actor is not None:
                self.actor.steps = int(g.attrs["actor_steps"])
                self.actor.rng.bit_generator.state = json.loads(g.attrs["np_rng"])
            if self.learner is not None and g.attrs.get("learner_rng", ""):
                self.learner.rng.bit_generator.state = json.loads(g.attrs["learner_rng"])
            if "next_eval" in g.attrs:        # else the evaluator evaluates at once
                self.next_eval = float(g.attrs["next_eval"])
            self.restored = {"wall_s": float(f.attrs["wall_s"]),
                             "evals": json.loads(f.attrs["evals"])}
            replay_files = json.loads(f.attrs["replay_files"])
        replay_file = ckpt.replay_file_of(Path(found), replay_files, me.node)
        if me.local_rank == 0 and replay_file is not None:
            with h5py.File(replay_file, "r") as rf:
                if json.loads(rf.attrs["signature"]) != json.loads(json.dumps(self.replay.signature())):
                    raise ConfigError("replay_capacity: the saved replay buffer does not match "
                                      "this run's (capacity, fanout, spec or regions differ)")
                group = rf["replay"]
                self.replay.load_state_arrays({name: group[name][()] for name in group})
        self.resumed_from = found
        wait_all(world)
        if world.Get_rank() == 0:
            print(f"pal_hpc: resumed from {found} (update {self.learner.updates}, "
                  f"{int(self.stats.mine[S.ENV_STEPS])} env steps on rank 0)", flush=True)

    def _find_checkpoint(self) -> str | None:
        """Rank 0: the checkpoint --resume names (verified), or None for a first start
        under --resume auto.  Raises ConfigError when there is none to resume."""
        cfg = self.cfg
        run_dir = cfg.resolved_run_dir()
        skipped: list = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if cfg.resume == "auto" and not ckpt.list_checkpoints(run_dir):
                    found = None                 # a first start: nothing to resume
                elif cfg.resume in ("latest", "auto"):
                    found = str(ckpt.latest_valid(run_dir, skipped))
                else:
                    ckpt.verify_all(Path(cfg.resume))
                    found = cfg.resume
            for w in caught:
                print(f"pal_hpc: warning: {w.message}", flush=True)
        except ckpt.CheckpointError as exc:
            raise ConfigError(f"resume: {exc}") from None
        # What failed to verify is set aside now, so no later prune or resume counts it.
        for path, reason in skipped:
            moved = ckpt.set_aside(path, reason)
            print(f"pal_hpc: set aside damaged checkpoint {path.name} -> {moved}", flush=True)
        if found is None:
            return None
        self.pruner.mark_good(Path(found))
        self.last_good = found
        # Going back to an older checkpoint abandons the newer ones: set them aside, so
        # that neither pruning nor a later --resume latest mistakes them for this run's.
        mine = Path(found).resolve()
        step = ckpt.step_of(mine)
        if mine.parent == ckpt.checkpoint_dir(run_dir).resolve() and step is not None:
            newer = [p for p in ckpt.list_checkpoints(run_dir) if ckpt.step_of(p) > step]
            for p in newer:
                moved = ckpt.set_aside(p, f"newer than {mine.name}, which --resume went back "
                                          f"to", folder=ckpt.SUPERSEDED)
                print(f"pal_hpc: set aside {p.name} -> {moved} (newer than the checkpoint "
                      f"resumed from)", flush=True)
        return found

    def _check_fits(self, attrs) -> None:
        """Refuse, naming the field, a checkpoint whose shapes differ from this run's."""
        saved = json.loads(attrs["config"])
        mine = config_to_dict(self.cfg)
        for name in ("algo", "env", "hidden", "dueling", "replay_capacity", "fanout",
                     "per_alpha", "per_eps"):
            if saved.get(name) != mine.get(name):
                raise ConfigError(f"{name}: the checkpoint was trained with {saved.get(name)!r}, "
                                  f"this run asks for {mine.get(name)!r}; resuming would change "
                                  f"shapes")
        layout = json.loads(attrs["layout"])
        now = [[r.node, r.is_actor, r.is_learner] for r in self.topo.roles]
        if layout != now:
            raise ConfigError(f"ranks_per_node: the checkpoint was written by {len(layout)} ranks "
                              f"laid out as {layout}; this run has {len(now)} laid out as {now}")


def _on_rank0(comm: MPI.Comm, fn):
    """Run `fn` on rank 0 of `comm`; a ConfigError it raises is raised on every rank
    (identically, so the job rejects it once).  Returns fn's result on rank 0."""
    result = err = None
    if comm.Get_rank() == 0:
        try:
            result = fn()
        except ConfigError as exc:
            err = str(exc)
    err = comm.bcast(err, root=0)
    if err:
        raise ConfigError(err)
    return result


def available_memory() -> tuple[int, str]:
    """Bytes this node can still give a shared-memory window, and where that limit is:
    the smaller of MemAvailable and the free space of /dev/shm (MPICH's windows live
    there, and containers often give it far less than the machine has)."""
    limits = []
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    limits.append((int(line.split()[1]) * 1024, "MemAvailable"))
    except OSError:
        pass
    try:
        st = os.statvfs("/dev/shm")
        limits.append((st.f_bavail * st.f_frsize, "free space in /dev/shm"))
    except OSError:
        pass
    return min(limits) if limits else (1 << 62, "unknown")


# The replay window may take at most this share of what the node has free: actors,
# learners, torch and the page cache need the rest.
MAX_REPLAY_SHARE = 0.8


def check_replay_fits(world: MPI.Comm, node: MPI.Comm, spec: dict, cfg, regions: int) -> None:
    """Refuse, before allocating, replay windows larger than the host can hold (an Atari
    buffer at the default capacity can ask for more than the whole machine).  Collective
    over `world`; virtual nodes on one host add up."""
    try:
        need = SharedReplay.window_nbytes(spec, cfg.replay_capacity, regions=regions,
                                          fanout=cfg.fanout)
    except (ValueError, OverflowError, MemoryError) as exc:
        raise ConfigError(f"replay_capacity: {cfg.replay_capacity:,} transitions cannot be "
                          f"laid out ({exc}); lower --replay-capacity") from None

    host = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    try:
        windows = host.allreduce(1 if node.Get_rank() == 0 else 0)

        def check():
            free, where = available_memory()
            if need * windows > MAX_REPLAY_SHARE * free:
                per = need / cfg.replay_capacity
                fits = int(MAX_REPLAY_SHARE * free / windows / per)
                raise ConfigError(
                    f"replay_capacity: {cfg.replay_capacity:,} transitions of {per:,.0f} B "
                    f"need {need / 2**30:,.2f} GiB of shared memory per node"
                    + (f" ({windows} replay buffers on this host)" if windows > 1 else "")
                    + f", but this host has {free / 2**30:,.2f} GiB free ({where}); lower "
                    f"--replay-capacity to at most {fits:,}")
        _on_rank0(host, check)
    finally:
        host.Free()


def _digest(algo) -> str:
    return hashlib.sha256(algo.get_flat_params().tobytes()).hexdigest()


def _write_json(path: Path, obj) -> None:
    """Write via a temporary file and a rename, so a reader never sees half a file.
    A failure (a full disk) is reported and leaves the old file, if any."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(json.dumps(obj, indent=1))
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        print(f"pal_hpc: error: could not write {path}: {exc}", file=sys.stderr, flush=True)


def train(cfg, topo) -> dict | None:
    """Run the job on this rank; rank 0 returns the summary."""
    return RankRun(cfg, topo).run()
