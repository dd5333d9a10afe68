"""`--schedule sync`: the off-policy runtime in fixed rounds, one result per seed.

A round, on every rank of the job:

1. the evaluator evaluates if an evaluation is due (with the round's weights);
2. every actor takes `round_steps` env steps (each of its envs round_steps /
   envs_per_actor) with the weights published at the end of the last round, keeping
   its transitions;
3. the node's replay takes them in actor order: local actor k writes its round's
   transitions into its own region (the slots follow from its write count), then a
   node barrier (`cluster.node_barrier`: futex words in the node's shared memory)
   passes the turn to actor k + 1 -- so the sum tree and its float sums
   see the same inserts in the same order whatever the timing; the last barrier
   also tells the node's learners that the round's data is in;
4. the learners take `round_updates` updates (each learner's sampler has its own
   seeded generator; a learner whose node holds fewer than learning_starts
   transitions sends zero rows into the same reductions).  New priorities are
   written after each update, the node's learners one after the other;
5. the node's first learner publishes the weights, and a node barrier gathers the
   node's ranks, so that they start the round's end together;
6. one job-wide sum of the counters (`StatsRounds.exchange`), then rank 0's decision
   -- stop, checkpoint, or go on -- broadcast to every rank.  Stops (budget, wall
   time, target, SIGTERM/SIGUSR1/SIGINT) and checkpoints happen at this boundary,
   which every rank reaches after the same collectives.

Every collective is started the same number of times on every rank: per round,
node_actors + 1 node barriers on every rank of the node, round_updates reductions
per phase on the learners' (plus one barrier per learner of the node around the
priority writes when a node has several learners), one sum and one broadcast on the
job's.  Waits sleep instead of spinning: ranks outnumber cores here, and an idle
rank's core is what the busy ones need.  The node barriers sleep in the kernel until
the last rank arrives; MPI's waits sleep with a short back-off (an MPI barrier among
sleeping ranks moved a hop per poll: the learner's polls through the actors' round
took their cores, and each turn waited a back-off interval per hop).

What is not bit-reproducible is what the clock decides: a wall-time stop, a
checkpoint every N seconds, a signal's round.  A resumed run is reproducible from
its checkpoint, but it is not the run that was not interrupted: environments are
reset at the start (their state is not saved), as are the actors' partial n-step
windows.
"""

from __future__ import annotations

import math
import time

import numpy as np
from mpi4py import MPI

from pal_hpc.cluster.node_barrier import NodeBarrier
from pal_hpc.config import ConfigError
from pal_hpc.runtime import signals
from pal_hpc.runtime import stats as S
from pal_hpc.runtime.evaluation import PERIODIC_SEED, evaluate
from pal_hpc.runtime.pacing import IDLE_SLEEP, REDUCING_SLEEP
from pal_hpc.runtime.run import RankRun

# Longest wait for one collective of a round before the job is called stuck (a dead
# rank ends the job sooner, through the lifeline).
ROUND_TIMEOUT = 600.0
ROUND_END_SLEEP = 0.0002     # longest back-off in the round's job-wide sums (s)


def settle(req: MPI.Request, timeout: float = ROUND_TIMEOUT,
           longest: float = IDLE_SLEEP) -> None:
    """Wait for `req`, sleeping: from REDUCING_SLEEP doubling up to `longest` (a short
    collective ends within microseconds, a long wait gives the core away)."""
    deadline = time.monotonic() + timeout
    pause = REDUCING_SLEEP
    while not req.Test():
        if time.monotonic() > deadline:
            raise TimeoutError(f"a collective of the synchronous schedule did not complete "
                               f"within {timeout:.0f}s: a rank is stuck")
        time.sleep(pause)
        pause = min(2 * pause, longest)


def settle_soon(req: MPI.Request) -> None:
    """`settle` for a collective that every rank of the node has just started (after a
    node barrier; only another node's lag can hold it up): its back-off stops at
    ROUND_END_SLEEP.  (At IDLE_SLEEP the actors saw the sums ~0.5 ms a round late.)"""
    settle(req, longest=ROUND_END_SLEEP)


def barrier(comm: MPI.Comm) -> None:
    """A barrier that sleeps while it waits."""
    settle(comm.Ibarrier())


def in_turn(comm: MPI.Comm, mine) -> None:
    """Collective over `comm`: rank 0 runs `mine()`, then rank 1, ... (one barrier per
    rank between turns).  A communicator of one rank just runs it."""
    if comm.Get_size() == 1:
        mine()
        return
    for turn in range(comm.Get_size()):
        if comm.Get_rank() == turn:
            mine()
        barrier(comm)


class PhaseClock:
    """Seconds by phase: `clock(name)` adds the time since the last call to `name`
    (`clock(None)` restarts the clock without adding)."""

    def __init__(self):
        self.totals: dict[str, float] = {}
        self._last = time.perf_counter()

    def clock(self, name: str | None) -> None:
        now = time.perf_counter()
        if name is not None:
            self.totals[name] = self.totals.get(name, 0.0) + now - self._last
        self._last = now


class SyncRankRun(RankRun):
    """One rank of a `--schedule sync` job (see the module docstring)."""

    def __init__(self, cfg, topo):
        super().__init__(cfg, topo)
        node = topo.node
        self.node_actors = sum(r.is_actor for r in topo.roles if r.node == topo.me.node)
        # The node's learners, for the turns of their priority writes.
        self.node_learners = node.Split(0 if self.me.is_learner else MPI.UNDEFINED,
                                        node.Get_rank())
        self.decisions = self.world.Dup()
        self.node_barrier = NodeBarrier(node, timeout=ROUND_TIMEOUT)
        self.per_round = self.n_actors * cfg.round_steps     # the job's env steps a round
        self._check_round_fits()
        if self.actor is not None:
            self.actor.write_batch = math.inf    # the round's writes wait for the turn
        self.phases, self.rounds = PhaseClock(), 0

    def _rank_profile(self) -> dict:
        """Wall ms per round by phase on this rank: evaluate, act (its round of env
        steps; an actor), write (its round into the replay; an actor), write_wait (the
        node's barriers that pass the turn to write, in actor order), learn (its
        updates; a learner),
        learn_wait (the node barrier after them: the actors wait for the learners),
        round_end (the counters' sum and rank 0's decision), other (progress rows,
        checkpoints)."""
        if not self.rounds:
            return {}
        out = {k: round(1e3 * v / self.rounds, 4) for k, v in self.phases.totals.items()}
        return {"rank": self.world.Get_rank(),
                "roles": "+".join(r for r, on in (("actor", self.actor is not None),
                                                  ("learner", self.learner is not None)) if on)
                or "none", **out, "wall_per_round": round(sum(out.values()), 4)}

    def _check_round_fits(self) -> None:
        """A round's transitions (round_steps, plus the n_step - 1 an n-step window may
        hold back from the round before) must fit an actor's region: a region that
        wraps within one write would overwrite its own round.  Every rank of the node
        checks the node's smallest region, so they all refuse together.  (A frame
        replay's streams are rings per environment, written a row at a time.)"""
        if self.actor_frames():
            return
        smallest = min(b - a for a, b in map(self.replay.region_slots,
                                             range(self.replay.regions)))
        need = self.cfg.round_steps + self.cfg.n_step - 1
        if need > smallest:
            raise ConfigError(f"round_steps: {self.cfg.round_steps} steps a round (+ n_step - 1) "
                              f"do not fit an actor's replay region of {smallest} slots "
                              f"(replay_capacity / actors per node); use fewer round_steps "
                              f"or a larger replay_capacity")

    def run(self) -> dict | None:
        """Rounds until the job stops; rank 0 returns the summary."""
        self._begin()
        clock = self.phases.clock
        clock(None)
        while True:
            self._fault_check()
            round_start = float(self.stats.total[S.ENV_STEPS])
            self._evaluate_if_due(round_start)
            clock("evaluate")
            # A rank has the phases of its roles: one that does not act (learn) has no
            # act (learn) entry, its instant of doing nothing goes to the next wait.
            self._act_round(round_start)
            if self.actor is not None:
                clock("act")
            self._write_in_actor_order()
            clock("write_wait")
            self._learn_round(min(1.0, (round_start + self.per_round) / self.cfg.total_steps))
            if self.learner is not None:
                clock("learn")
            # The node's ranks start the round's job-wide sums together, awake: no hop
            # of them waits for a sleeping rank to poll.
            self.node_barrier.wait()
            clock("learn_wait")
            stop, checkpoint = self._round_end()
            clock("round_end")
            self.rounds += 1
            self._system_row()
            self.telemetry.poll()
            if stop:
                break
            if checkpoint:
                self._checkpoint(self.stats.total.copy())
                self.checkpoints_done += 1
            clock("other")
        if self.node_learners != MPI.COMM_NULL:
            self.node_learners.Free()
        self.decisions.Free()
        self.node_barrier.free()
        return self._wind_down()

    # -- the parts of a round ------------------------------------------------------
    def _evaluate_if_due(self, round_start: float) -> None:
        if not (self.evaluator and round_start >= self.next_eval):
            return
        self.actor.pull_weights()
        t0 = time.monotonic()
        returns = evaluate(self.cfg, self.policy, self.cfg.eval_episodes,
                           seed=self.cfg.seed + PERIODIC_SEED + int(round_start))
        stats = self.stats
        stats.add(S.EVAL_SUM, returns.sum())
        stats.add(S.EVAL_SUMSQ, (returns ** 2).sum())
        stats.add(S.EVAL_COUNT, len(returns))
        stats.add(S.EVAL_STEP, round_start)
        stats.add(S.EVAL_SECONDS, time.monotonic() - t0)
        self.next_eval = (round_start // self.cfg.eval_every + 1) * self.cfg.eval_every

    def _act_round(self, round_start: float) -> None:
        """This actor's round_steps env steps with the round's weights, kept back."""
        actor = self.actor
        if actor is None:
            return
        actor.pull_weights()
        envs = len(actor.envs)
        for k in range(self.cfg.round_steps // envs):
            # The job's env step as if every actor stepped at this one's pace, which in
            # rounds they do: the exploration schedule is a function of the round.
            actor.step(round_start + k * envs * self.n_actors)
        now = time.monotonic() - self.start
        end = int(min(round_start + self.per_round, self.cfg.total_steps))
        for ret, length in actor.drain_episodes():
            self.stats.add(S.EPISODES, 1)
            self.stats.add(S.RETURN_SUM, ret)
            self.stats.add(S.RETURN_COUNT, 1)
            self.telemetry.record("episodes", (end, now, self.me.actor_index, ret, length))
        self.stats.set(S.ENV_STEPS, actor.steps)

    def _write_in_actor_order(self) -> None:
        """The node's actors write their rounds one after the other, local actor 0
        first; every rank of the node takes part in the barriers."""
        mine = self.actor.region if self.actor is not None else -1
        for turn in range(self.node_actors):
            if turn == mine:
                self.phases.clock("write_wait")
                self.actor.flush()
                self.phases.clock("write")
            self.node_barrier.wait()

    def _learn_round(self, progress: float) -> None:
        """round_updates updates, the priorities written in learner order after each,
        then the node's first learner publishes the weights."""
        learner = self.learner
        if learner is None:
            return
        for _ in range(self.cfg.round_updates):
            before, target = learner.updates, learner.attempts + 1
            pause = REDUCING_SLEEP
            while learner.attempts < target:
                if learner.step(False, progress):
                    pause = REDUCING_SLEEP
                else:
                    t0 = time.perf_counter()
                    time.sleep(pause)
                    learner.profile["sleep_reducing"] += time.perf_counter() - t0
                    pause = min(2 * pause, IDLE_SLEEP)
            in_turn(self.node_learners, self._write_priorities)
            self._learner_row(before)
        if learner.weights is not None:
            learner.weights.publish(learner.algo.policy_params())

    def _write_priorities(self) -> None:
        learner = self.learner
        for indices, priorities, tickets in learner.stashed:
            self.replay.update_priorities(indices, priorities, tickets)
        learner.stashed.clear()

    def _round_end(self) -> tuple[bool, bool]:
        """The job-wide counters, then rank 0's (stop, checkpoint), the same on every
        rank."""
        stats = self.stats
        if signals.requested:
            stats.set(S.PREEMPT, 1)         # checkpoint at this boundary, then stop
        if self.me.local_rank == 0:
            stats.set(S.REPLAY_SIZE, self.replay.size())
        stats.exchange(settle_soon)
        decision = np.zeros(2)
        if self.coord is not None:
            stop = self.coord.observe(stats.total)
            decision[:] = stop, (not stop) and self.coord.checkpoint_due()
        settle_soon(self.decisions.Ibcast(decision, root=0))
        return bool(decision[0]), bool(decision[1])


__all__ = ["SyncRankRun", "in_turn", "settle"]
