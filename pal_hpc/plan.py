"""How many actors and how many learners: measure this machine, predict every split.

    python -m pal_hpc.plan [the flags of pal_hpc.main] --ranks N [--cores C] [--json]

measures, on this machine and for this configuration, what one actor and one learner
cost, and predicts for every split of each node's ranks into learners and actors the
env steps/s and updates/s of the job, and which side limits it.  It prints the table
and marks the recommended split.  `--actors-per-node auto --learners-per-node auto` on
`pal_hpc.main` does the same at start-up (a few seconds of measurement on rank 0,
broadcast before the roles are assigned), and `summary.json` records the plan beside
what the run then measured.  The on-policy algorithm (paac) has no such split: it is
refused.

What is measured (median over repetitions of CPU time, this process alone)
--------------------------------------------------------------------------
- a: CPU-seconds of an actor per env step -- the real `runtime.actor.Actor` stepping
  `envs_per_actor` environments with one batched policy forward per step, building
  n-step transitions and inserting them into a private `SharedReplay`.  For the
  record it is also broken down: one env step with random actions, one policy forward
  on `envs_per_actor` observations, one replay insert per transition.
- u: CPU-seconds of one learner update -- sample `batch_size` transitions from a
  private `SharedReplay` filled with random transitions of the run's transition spec,
  then for each of the algorithm's phases compute the gradient, apply it and (critic
  phase) update the sampled priorities; averaged over the phase cycle (TD3: 1.5
  phases per update).  On a GPU learner u is wall time.
- the main loop: l, the CPU-seconds of one iteration's bookkeeping (counters' Iallreduce
  poll, telemetry probe, rate-limiter checks), added to a once per actor step (l / E
  per env step) and to u once per phase; and w, the share of a core a sleeping rank
  uses waking every millisecond to poll (CPU per wake-up / its wall time).
- r(L): wall seconds one phase's Allreduce of the flat gradient takes among L learners
  when each polls it as the runtime's learner does (Test, else a 20 us sleep): measured
  for the learner counts the candidates need, among the job's own ranks at start-up
  (learners spread over the nodes as the roles will be) or a helper `mpiexec` job in
  the CLI.  Between measured counts it is interpolated in log2(L).
- C_h: cores of host h (`os.sched_getaffinity`, the union over the host's ranks).

The model (steady state of the rate limiter; pure functions: `predict`, `recommend`)
------------------------------------------------------------------------------------
Every update is synchronous over all learners of the job: U updates/s, each learner
sampling `batch` transitions per update.  The rate limiter (sampled = ratio x inserted
on each node, learners and actors both held to it) ties node n's env steps to U:

    S_n = U * k_n,   k_n = L_n * batch / ratio          (env steps per update on node n)

A rank needs, per update, d CPU-seconds and z seconds asleep in the Allreduce:

    learner:  d = u,              z = P * r(L)      every learner does every update
    actor:    d = k_n * a / A_n,  z = 0             node n's A_n actors share its steps
    solo:     d = k_n * a + u,    z = P * r(L)      a 1-rank node acts and learns

(L = sum_n L_n learners in the job, P phases per update; r = 0 for one learner.)  It
computes at c_h of a core, the fair share Linux's scheduler gives each busy process of
host h: c_h = min(1, C_h / (X_h + B_h)), B_h = the sum over the host's ranks of their
busy fraction b + (1 - b) * w, b = min(1, U * d / c_h) (asleep, a rank still wakes),
X_h the busy processes of other programs (the largest fixed point).  U is the largest rate at which every rank's second holds its work:

    U * (d / c_h + z) <= 1                              for every rank

With free cores (c = 1) that is U = min(1 / (u + P r), A_n / (k_n a), solo 1 / (k_n a
+ u + P r)); when every rank is busy and ranks outnumber cores it becomes the cores'
U = C_h / sum_{n on h} (k_n a + L_n u).  For one node with no other programs:

    S = min(A / a,  L * batch / (ratio * (u + P r)),  C / (a + ratio * u / batch))

The job does S = U * sum_n k_n env steps/s and U * L gradient batches/s.  The
bottleneck is "cores" when the rank that sets U shares its cores (c_h < 1), else that
rank's side, "learners" or "actors".  X is estimated from the CPU share s the
measuring process got: X = C / s - 1 when s < 0.95 (a busy machine), else 0 -- a free
core says nothing about how many others are free (the CLI's --others overrides it).
Waiting in the Allreduce is sleep (but for w); rank 0's extra duties (the metrics log,
progress lines) are not counted.  It is a throughput model: with L learners each
update averages L batches, so updates per env step fall as 1/L -- how fast the agent
learns per env step is not modelled.

Recommendation: every split of each node size into L >= 1 learners and A >= 1 actors
(a count given as a number stays fixed) is predicted, and the split with the most
synchronous updates per second wins: at a fixed replay ratio an agent learns by
optimizer steps, and a split that adds learners only to average more batches per step
takes fewer steps per env step (on CartPole-v1 at -n 4, 3 learners + 1 actor have the
most env steps/s, yet took 25,040 env steps and 31 s to 475 against 10-15k and 8-14 s
for 1 learner + 3 actors).  Predictions within 5% of the most updates/s count as a tie
(the measurements are not more precise); a tie goes to the most env steps/s, then to
the most env steps/s with free cores (the split that stays fastest if other programs
leave the machine), then to fewer learners.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time
import dataclasses
from dataclasses import asdict, dataclass, field

import numpy as np

from pal_hpc.config import AUTO, ConfigError
# How long an idle rank sleeps, and one whose learner waits for an Allreduce.
from pal_hpc.runtime.run import IDLE_SLEEP as SLEEP_S
from pal_hpc.runtime.run import REDUCING_SLEEP

KINDS = ("learners", "actors", "cores")     # bottleneck names, in tie order
TIE = 0.05            # relative: predictions this close are equal (measurement noise)
STEADY_STEPS = 1e12                         # global steps: past every exploration schedule
MAX_SPLITS = 200_000


# ---------------------------------------------------------------------------------------
# The model: pure functions of measured rates.

@dataclass(frozen=True)
class Rates:
    """The measured inputs of the model, in seconds (see the module docstring)."""

    actor_step_s: float                     # a: actor CPU-seconds per env step
    update_s: float                         # u: learner seconds per update
    phases_per_update: float = 1.0          # P: Allreduces per update
    sync_s: tuple[tuple[int, float], ...] = ()   # (L, r(L)): seconds per phase's Allreduce
    idle_cpu: float = 0.0                   # w: cores a sleeping rank uses waking up


@dataclass(frozen=True)
class Layout:
    """The job's nodes: node i has `sizes[i]` ranks and runs on host `hosts[i]`, which
    has `cores[hosts[i]]` cores (shared by all the nodes on it)."""

    sizes: tuple[int, ...]
    hosts: tuple[int, ...]
    cores: tuple[float, ...]
    others: tuple[float, ...] = ()          # X_h: other programs' busy processes (0)

    @classmethod
    def one_host(cls, ranks: int, cores: float, ranks_per_node: int = 0,
                 others: float = 0.0) -> Layout:
        """`ranks` ranks on one host, as one node or as virtual nodes of `ranks_per_node`."""
        from pal_hpc.cluster.topology import node_sizes_for

        sizes = node_sizes_for(ranks, ranks_per_node) if ranks_per_node > 0 else [ranks]
        return cls(tuple(sizes), (0,) * len(sizes), (float(cores),), (float(others),))

    @property
    def ranks(self) -> int:
        return sum(self.sizes)


@dataclass(frozen=True)
class Prediction:
    """The model's answer for one split: `learners[i]` and `actors[i]` on node i (a
    1-rank node counts 1 of each: it does both)."""

    learners: tuple[int, ...]
    actors: tuple[int, ...]
    env_steps_per_s: float
    updates_per_s: float                    # synchronous updates of the job
    gradient_batches_per_s: float           # updates/s x learners
    bottleneck: str                         # one of KINDS
    unlimited_env_steps_per_s: float        # the same with free cores (c = 1)

    @property
    def total_learners(self) -> int:
        return sum(self.learners)


def sync_time(sync_s: tuple[tuple[int, float], ...], learners: int) -> float:
    """r(L): seconds one phase's Allreduce takes among `learners`; 0 for one learner or
    when nothing was measured.  Interpolated linearly in log2(L) between measured counts,
    extrapolated in proportion to log2(L) beyond the largest."""
    if learners <= 1 or not sync_s:
        return 0.0
    points = sorted((n, s) for n, s in sync_s if n >= 2)
    if not points:
        return 0.0
    for (n0, s0), (n1, s1) in zip(points, points[1:]):
        if n0 <= learners <= n1:
            w = (math.log2(learners) - math.log2(n0)) / (math.log2(n1) - math.log2(n0))
            return s0 + w * (s1 - s0)
    n0, s0 = points[0] if learners < points[0][0] else points[-1]
    return s0 * math.log2(learners) / math.log2(n0)


def predict(layout: Layout, learners: tuple[int, ...], rates: Rates, batch_size: int,
            replay_ratio: float) -> Prediction:
    """Env steps/s, updates/s and the bottleneck of the job with `learners[i]` learner
    ranks on node i (1-rank nodes: 1, solo) -- the model of the module docstring."""
    if len(learners) != len(layout.sizes):
        raise ValueError(f"{len(learners)} learner counts for {len(layout.sizes)} nodes")
    a, u = rates.actor_step_s, rates.update_s
    if not (a > 0 and u > 0):
        raise ValueError(f"rates must be positive, got a={a!r}, u={u!r}")
    actors = []
    for size, n_learners in zip(layout.sizes, learners):
        if size == 1 and n_learners != 1 or size > 1 and not 1 <= n_learners < size:
            raise ValueError(f"a node of {size} ranks cannot have {n_learners} learners")
        actors.append(1 if size == 1 else size - n_learners)
    k = [n * batch_size / replay_ratio for n in learners]
    total_learners = sum(learners)
    sync = rates.phases_per_update * sync_time(rates.sync_s, total_learners)
    # Rank groups: (host, ranks, CPU-seconds per update of each, sleep per update, kind).
    groups = []
    for host, size, kn, n, an in zip(layout.hosts, layout.sizes, k, learners, actors):
        if size == 1:
            groups.append((host, 1, kn * a + u, sync, "learners" if u + sync >= kn * a
                           else "actors"))
        else:
            groups.append((host, n, u, sync, "learners"))
            groups.append((host, an, kn * a / an, 0.0, "actors"))
    cores = layout.cores
    others = layout.others or (0.0,) * len(cores)
    hi = min(1.0 / (d + z) for _, _, d, z, _ in groups)        # every rank on a free core

    def shares(rate: float, limited: bool = True) -> list[float]:
        if not limited:
            return [1.0] * len(cores)
        return [fair_share([(rate * d, m) for g, m, d, _, _ in groups if g == h], c_h,
                           others[h], rates.idle_cpu) for h, c_h in enumerate(cores)]

    def slack(rate: float, limited: bool = True) -> list[float]:
        # Per group: 1 - the fraction of a second its ranks need (computing at their
        # share, plus sleeping in the Allreduce); negative = infeasible.
        c = shares(rate, limited)
        return [1.0 - rate * (d / c[g] + z) for g, _, d, z, _ in groups]

    def best_rate(limited: bool) -> float:
        lo, top = 0.0, hi
        if min(slack(top, limited)) >= 0:
            return top
        for _ in range(100):
            mid = (lo + top) / 2
            lo, top = (mid, top) if min(slack(mid, limited)) >= 0 else (lo, mid)
            if top - lo <= 1e-10 * top:
                break
        return lo

    rate = best_rate(limited=True)
    # What stops a slightly higher rate: a rank's time, on a shared core or a free one.
    above = rate * (1 + 1e-6) + 1e-12
    over = slack(above)
    binding = min(range(len(groups)), key=lambda i: over[i])
    host_share = shares(above)[groups[binding][0]]
    kind = "cores" if host_share < 1 - 1e-9 else groups[binding][4]
    unlimited = best_rate(limited=False)
    steps_per_update = sum(k)
    return Prediction(tuple(learners), tuple(actors), rate * steps_per_update, rate,
                      rate * total_learners, kind, unlimited * steps_per_update)


def fair_share(demands: list[tuple[float, int]], cores: float, others: float = 0.0,
               idle_cpu: float = 0.0) -> float:
    """c: the share of a core each busy process of a host gets (Linux's CFS is fair),
    c = min(1, cores / (others + B)), where B sums the busy fractions of the host's
    ranks -- `demands` holds (cores of CPU one rank needs, ranks like it), busy for
    min(1, demand / c) of the time and waking up for `idle_cpu` of the rest.  B grows
    as c shrinks; c * (others + B(c)) increases piecewise linearly in c, and the
    answer is where it meets `cores` (1 if it stays below)."""
    w = idle_cpu

    def load(c: float) -> float:
        return c * others + sum(m * ((1 - w) * min(c, t) + w * c) for t, m in demands)

    if load(1.0) <= cores:
        return 1.0
    points = sorted({t for t, _ in demands if 0 < t < 1} | {0.0, 1.0})
    for lo, top in zip(points, points[1:]):
        if load(top) >= cores:                  # the crossing is in [lo, top]
            slope = others + sum(m * (w + (1 - w) * (t >= top)) for t, m in demands)
            base = sum(m * (1 - w) * t for t, m in demands if t <= lo)
            return min(top, (cores - base) / slope) if slope > 0 else top
    return 1.0


def others_from_share(cores: float, share: float) -> float:
    """X: other programs' busy processes on a host of `cores` cores on which a busy
    process got `share` of a core (fair share: share = cores / (X + 1)); 0 when it got
    (nearly) a whole core."""
    return max(0.0, cores / share - 1.0) if 0 < share < 0.95 else 0.0


def candidate_learners(size: int, actors_per_node: float | str,
                       learners_per_node: float | str) -> list[int]:
    """The learner counts a node of `size` ranks may get: every split when the counts
    are auto (or 0 beside auto), else the one the given number fixes."""
    from pal_hpc.cluster.topology import _resolve

    if size == 1:
        return [1]
    if learners_per_node not in (0, AUTO):
        name, value = "learners_per_node", learners_per_node
        fixed = _resolve(value, size)
    elif actors_per_node not in (0, AUTO):
        name, value = "actors_per_node", actors_per_node
        fixed = size - _resolve(value, size)
    else:
        return list(range(1, size))
    if not 1 <= fixed < size:
        raise ConfigError(f"{name}: {value!r} leaves no valid split of a node of {size} "
                          "ranks (a node needs at least 1 learner and 1 actor)")
    return [fixed]


def all_splits(layout: Layout, actors_per_node: float | str = AUTO,
               learners_per_node: float | str = AUTO) -> list[tuple[int, ...]]:
    """Every learners-per-node tuple to consider: one choice per distinct node size
    (nodes of one size get the same split)."""
    sizes = sorted(set(layout.sizes))
    choices = [candidate_learners(s, actors_per_node, learners_per_node) for s in sizes]
    if math.prod(len(c) for c in choices) > MAX_SPLITS:
        raise ConfigError(f"ranks_per_node: {len(sizes)} different node sizes give too many "
                          "splits to compare; make the nodes the same size")
    out = []
    for combo in itertools.product(*choices):
        by_size = dict(zip(sizes, combo))
        out.append(tuple(by_size[s] for s in layout.sizes))
    return out


def default_split(layout: Layout) -> tuple[int, ...]:
    """The learners per node of the fixed default split (both counts 0)."""
    from pal_hpc.cluster.topology import node_counts

    return tuple(node_counts(i, s)[0] for i, s in enumerate(layout.sizes))


def recommend(predictions: list[Prediction]) -> Prediction:
    """The most predicted updates/s (optimizer steps); ties (within TIE, relative) go to
    the most env steps/s, then to the most env steps/s with free cores, then to fewer
    learners."""
    if not predictions:
        raise ValueError("no split to choose from")
    best = max(p.updates_per_s for p in predictions)
    tied = [p for p in predictions if p.updates_per_s >= best * (1 - TIE)]
    return max(tied, key=lambda p: (p.env_steps_per_s, p.unlimited_env_steps_per_s,
                                    -p.total_learners, tuple(-n for n in p.learners)))


def split_by_size(layout: Layout, p: Prediction) -> dict[str, list[int]]:
    """{node size: [learners, actors]} (JSON keys) for nodes of 2+ ranks."""
    return {str(s): [n, a] for s, n, a in sorted(set(zip(layout.sizes, p.learners, p.actors)))
            if s > 1}


def describe(layout: Layout, p: Prediction) -> str:
    """"1 learner + 3 actors per node" (per node size when the nodes differ)."""
    parts = []
    sizes = sorted(set(layout.sizes), reverse=True)
    for s in sizes:
        i = layout.sizes.index(s)
        text = ("solo (acts and learns)" if s == 1 else
                f"{_n(p.learners[i], 'learner')} + {_n(p.actors[i], 'actor')}")
        parts.append(text + (f" on nodes of {s}" if len(sizes) > 1 else " per node"))
    return "; ".join(parts)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def make_plan(layout: Layout, rates: Rates, batch_size: int, replay_ratio: float,
              actors_per_node: float | str = AUTO, learners_per_node: float | str = AUTO,
              forced: tuple[int, ...] | None = None) -> dict:
    """The plan as plain JSON: every split's prediction, the recommended one (or
    `forced`, a split kept from a checkpoint), the default split's, and the inputs."""
    splits = all_splits(layout, actors_per_node, learners_per_node)
    table = [predict(layout, s, rates, batch_size, replay_ratio) for s in splits]
    chosen = recommend(table)
    if forced is not None:
        chosen = predict(layout, forced, rates, batch_size, replay_ratio)
    default = predict(layout, default_split(layout), rates, batch_size, replay_ratio)

    def row(p: Prediction) -> dict:
        return {"split": split_by_size(layout, p), "learners": p.total_learners,
                "actors": sum(p.actors), "env_steps_per_s": p.env_steps_per_s,
                "updates_per_s": p.updates_per_s,
                "gradient_batches_per_s": p.gradient_batches_per_s,
                "bottleneck": p.bottleneck, "describe": describe(layout, p)}

    return {**row(chosen), "default": row(default), "table": [row(p) for p in table],
            "inputs": {"actor_step_s": rates.actor_step_s, "update_s": rates.update_s,
                       "phases_per_update": rates.phases_per_update,
                       "sync_s": {str(n): s for n, s in rates.sync_s},
                       "idle_cpu": rates.idle_cpu,
                       "batch_size": batch_size, "replay_ratio": replay_ratio,
                       "node_sizes": list(layout.sizes), "node_hosts": list(layout.hosts),
                       "host_cores": list(layout.cores),
                       "host_others": list(layout.others or (0.0,) * len(layout.cores))}}


def beside_run(plan: dict, summary: dict) -> dict:
    """The plan with what the run measured beside it (whole-run averages: the warm-up
    before learning_starts and the evaluations are in them) and the relative error of
    the prediction, (predicted - measured) / measured."""
    wall = summary.get("wall_s") or 0.0
    out = {k: v for k, v in plan.items()}
    if wall > 0:
        measured = {"env_steps_per_s": summary["env_steps"] / wall,
                    "updates_per_s": summary["updates"] / wall}
        measured["gradient_batches_per_s"] = measured["updates_per_s"] * plan["learners"]
        out["measured"] = measured
        out["relative_error"] = {k: (plan[k] - v) / v if v > 0 else None
                                 for k, v in measured.items()}
    return out


# ---------------------------------------------------------------------------------------
# Measurement (rank 0 at start-up, or the CLI's process).

@dataclass
class Measured:
    """What `measure_rates` found, in seconds (CPU time unless said otherwise)."""

    actor_step_s: float
    update_s: float
    phases_per_update: float
    gradient_floats: int                    # the largest phase's flat gradient
    env_step_s: float
    forward_s: float                        # one policy forward on envs_per_actor obs
    insert_s: float                         # replay insert, per transition
    loop_s: float                           # the main loop's bookkeeping per iteration
    wake_s: float                           # CPU of an idle rank's wake-up (+ bookkeeping)
    sleep_s: float                          # wall time of an idle rank's 1 ms sleep
    cpu_share: float                        # CPU / wall while measuring (1 = a free core)
    device: str
    measure_s: float
    sync_s: dict[int, float] = field(default_factory=dict)

    def rates(self) -> Rates:
        return Rates(self.actor_step_s, self.update_s, self.phases_per_update,
                     tuple(sorted(self.sync_s.items())), self.wake_s / self.sleep_s)


def _time_calls(fn, budget_s: float, target_block_s: float = 0.01, multiple: int = 1,
                min_blocks: int = 3, max_blocks: int = 200, sync=None):
    """Median (CPU, wall) seconds per call of `fn`, timed in blocks of several calls
    (a multiple of `multiple`) until `budget_s` is spent; one untimed block first."""
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    per_block = max(multiple, int(target_block_s / one) // multiple * multiple)
    cpu, wall = [], []
    start = time.perf_counter()
    for b in range(max_blocks + 1):
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(per_block):
            fn()
        if sync is not None:
            sync()
        if b > 0:                             # the first block warms up
            cpu.append((time.process_time() - c0) / per_block)
            wall.append((time.perf_counter() - w0) / per_block)
        if len(cpu) >= min_blocks and time.perf_counter() - start > budget_s:
            break
    return statistics.median(cpu), statistics.median(wall)


def random_transitions(spec: dict, n: int, rng: np.random.Generator, gamma: float,
                       n_step: int, act_space) -> dict[str, np.ndarray]:
    """`n` plausible transitions of `spec`: observations N(0, 1) (uint8 frames uniform),
    valid actions, rewards N(0, 1), discount gamma**n_step (0 for 2% terminals)."""
    import gymnasium as gym

    out = {}
    for name, (shape, dtype) in spec.items():
        if name in ("obs", "next_obs"):
            out[name] = (rng.integers(0, 256, (n, *shape), dtype=np.uint8)
                         if dtype == np.uint8 else rng.standard_normal((n, *shape)).astype(dtype))
        elif name == "action":
            out[name] = (rng.integers(0, act_space.n, n).astype(dtype)
                         if isinstance(act_space, gym.spaces.Discrete)
                         else rng.uniform(-1, 1, (n, *shape)).astype(dtype))
        elif name == "reward":
            out[name] = rng.standard_normal(n).astype(dtype)
        else:                                 # discount
            out[name] = np.where(rng.random(n) < 0.02, 0.0, gamma ** n_step).astype(dtype)
    return out


def measure_rates(cfg, budget_s: float = 3.0, max_replay_bytes: int = 64 << 20) -> Measured:
    """Measure a, u and their parts for `cfg` on this process (about `budget_s` seconds
    plus set-up).  Raises ConfigError for an on-policy algorithm or an env the
    algorithm cannot train on."""
    import torch

    from pal_hpc.algos import ALGOS
    from pal_hpc.cluster.topology import pick_device
    from pal_hpc.cluster.weights import WeightStore
    from pal_hpc.envs import action_info, make_env, obs_info
    from pal_hpc.replay import SharedReplay
    from pal_hpc.runtime.actor import Actor
    from pal_hpc.runtime.learner import METRICS_EVERY
    from pal_hpc.runtime.nstep import transition_spec

    Algo = ALGOS[cfg.algo]
    if getattr(Algo, "on_policy", False):
        raise ConfigError(f"algo: the planner splits ranks into actors and learners, which "
                          f"--algo {cfg.algo} does not have (it runs one master per node and "
                          "environment workers); plan dqn, ddpg, td3 or sac")
    started = time.perf_counter()
    torch.set_num_threads(cfg.torch_threads)
    torch.set_flush_denormal(True)
    rng = np.random.default_rng(cfg.seed)
    env = make_env(cfg.env, cfg.seed, terminal_on_life_loss=cfg.atari_terminal_on_life_loss)
    Algo.check_env(cfg.env, env.observation_space, env.action_space)
    spec = transition_spec(*obs_info(env), *action_info(env))
    share = budget_s / 3.0

    def env_step():
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()

    env_step_s, _ = _time_calls(env_step, 0.3 * share)

    algo = Algo(env.observation_space, env.action_space, cfg.algo_config, device="cpu",
                seed=cfg.seed)
    policy = algo.make_policy(0, 1)
    obs = np.stack([env.reset()[0] for _ in range(cfg.envs_per_actor)])
    env.close()
    forward_s, _ = _time_calls(lambda: policy.act(obs, rng, STEADY_STEPS), 0.3 * share)

    # The run's capacity, up to max_replay_bytes (Atari frames are 56 KB a transition).
    row_bytes = SharedReplay.window_nbytes(spec, 1024) / 1024
    capacity = min(cfg.replay_capacity,
                   int(max(4 * cfg.batch_size, 4096, max_replay_bytes // row_bytes)))
    replay = SharedReplay(spec, capacity, fanout=cfg.fanout, alpha=cfg.per_alpha,
                          eps=cfg.per_eps)
    weights = WeightStore(policy.num_params)
    actor = None
    try:
        write = random_transitions(spec, 32, rng, cfg.gamma, cfg.n_step, algo.act_space)
        insert_s, _ = _time_calls(lambda: replay.add(0, write), 0.2 * share)
        insert_s /= 32
        # The real actor: envs_per_actor envs, one forward, n-step, inserts every 32.
        weights.publish(algo.policy_params())
        actor = Actor(cfg, policy, replay, 0, weights, 0, 1)
        actor_step_s, actor_wall = _time_calls(lambda: actor.step(STEADY_STEPS), share,
                                               multiple=8)
        actor_step_s /= cfg.envs_per_actor
        actor_wall /= cfg.envs_per_actor
        wake_s, loop_s, sleep_s = _loop_costs(replay, actor, 0.3 * share)

        # The learner: fill the buffer, vary the priorities, then time whole updates.
        for start in range(0, capacity, 4096):
            n = min(4096, capacity - start)
            replay.add(0, random_transitions(spec, n, rng, cfg.gamma, cfg.n_step,
                                             algo.act_space))
        device = pick_device(cfg.device, 0)
        learner = algo if device.type == "cpu" else Algo(
            env.observation_space, env.action_space, cfg.algo_config, device=device,
            seed=cfg.seed)
        phase_lists = [learner.phases(i) for i in range(8)]
        send = np.zeros(max(learner.phase_size(p) for ps in phase_lists for p in ps),
                        np.float32)
        count = [0]

        def update():
            i = count[0]
            count[0] += 1
            batch = replay.sample(cfg.batch_size, beta=cfg.per_beta, rng=rng)
            for phase in learner.phases(i):
                n = learner.phase_size(phase)
                _, prio = learner.compute_gradients(phase, batch, out=send[:n],
                                                    metrics=(i + 1) % METRICS_EVERY == 0)
                if prio is not None:
                    replay.update_priorities(batch["indices"], prio, batch["tickets"])
                learner.apply_gradients(phase, send[:n])

        cuda_sync = torch.cuda.synchronize if device.type == "cuda" else None
        update_cpu, update_wall = _time_calls(update, 1.2 * share, multiple=10,
                                              sync=cuda_sync)
        update_s = update_wall if device.type == "cuda" else update_cpu
    finally:
        if actor is not None:
            actor.close()
        replay.close()

    phases = float(np.mean([len(ps) for ps in phase_lists]))
    return Measured(
        # One loop iteration per actor step (of envs_per_actor envs), one per phase.
        actor_step_s=actor_step_s + loop_s / cfg.envs_per_actor,
        update_s=update_s + phases * loop_s, phases_per_update=phases,
        gradient_floats=int(send.size), env_step_s=env_step_s, forward_s=forward_s,
        insert_s=insert_s, loop_s=loop_s, wake_s=wake_s, sleep_s=sleep_s,
        cpu_share=min(1.0, (actor_step_s / actor_wall + update_cpu / update_wall) / 2),
        device=str(device), measure_s=time.perf_counter() - started)


def _loop_costs(replay, actor, budget_s: float) -> tuple[float, float, float]:
    """(CPU per idle wake-up, of it the loop's bookkeeping, wall per wake-up): a rank
    with nothing to do sleeps 1 ms, then polls its counters' Iallreduce, its telemetry
    and the rate limiter -- here a StatsRounds on COMM_SELF, an Iprobe and the actor's
    checks stand for them.  The bookkeeping is the difference to a bare sleep."""
    from mpi4py import MPI

    from pal_hpc.runtime.stats import StatsRounds

    stats = StatsRounds(MPI.COMM_SELF)

    def bookkeeping():
        stats.poll()
        stats.set(0, float(actor.steps))
        time.monotonic()
        time.monotonic()
        MPI.COMM_SELF.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
        actor.may_insert()
        replay.inserted() < replay.sampled()

    bare_cpu, wall = _time_calls(lambda: time.sleep(SLEEP_S), budget_s / 2,
                                 target_block_s=0.02)
    wake_cpu, _ = _time_calls(lambda: (time.sleep(SLEEP_S), bookkeeping()), budget_s / 2,
                              target_block_s=0.02)
    stats.finish()
    return wake_cpu, max(0.0, wake_cpu - bare_cpu), wall


def sync_counts(layout: Layout, splits: list[tuple[int, ...]], most: int = 12) -> list[int]:
    """The total learner counts (>= 2) whose Allreduce to measure: all of them when
    few, else `most` spread evenly in log2 (the rest are interpolated)."""
    counts = sorted({sum(s) for s in splits if sum(s) >= 2})
    if len(counts) <= most:
        return counts
    picks = {counts[0], counts[-1]}
    for i in range(1, most - 1):
        target = counts[0] * (counts[-1] / counts[0]) ** (i / (most - 1))
        picks.add(min(counts, key=lambda c: abs(math.log2(c) - math.log2(target))))
    return sorted(picks)


def measure_sync(comm, counts: list[int], floats: int, order: list[int] | None = None,
                 reps: int = 8) -> dict[int, float]:
    """Collective over `comm`: for each L in `counts`, the first L ranks of `order`
    (default: by rank) post `reps` Iallreduces of `floats` float32 and poll each as a
    learner does (Test, else a short sleep); the others sleep meanwhile.  Returns, on
    rank 0 of `comm` (which must be first in `order`), {L: the slowest member's median
    seconds per Allreduce}; {} elsewhere."""
    from mpi4py import MPI

    from pal_hpc.cluster.collectives import wait_all

    rank, size = comm.Get_rank(), comm.Get_size()
    order = list(range(size)) if order is None else list(order)
    send = np.ones(floats + 3, np.float32)     # + the learner's three vote slots
    recv = np.empty_like(send)
    out = {}
    for n in counts:
        if n > size:
            continue
        members = order[:n]
        mine = rank in members
        sub = comm.Split(0 if mine else MPI.UNDEFINED, members.index(rank) if mine else 0)
        median = 0.0
        if mine:
            times = []
            for _ in range(reps + 1):              # the first warms up
                t0 = time.perf_counter()
                req = sub.Iallreduce(send, recv, op=MPI.SUM)
                while not req.Test():
                    time.sleep(REDUCING_SLEEP)
                times.append(time.perf_counter() - t0)
            sub.Free()
            median = statistics.median(times[1:])
        wait_all(comm)
        medians = comm.gather(median if mine else None, root=0)
        if rank == 0:
            out[n] = max(m for m in medians if m is not None)
    return out


def _sync_probe_main() -> None:
    """`mpiexec -n N python -m mpi4py -m pal_hpc.plan --sync-probe COUNTS FLOATS`:
    rank 0 prints measure_sync's JSON."""
    from mpi4py import MPI

    counts = [int(c) for c in sys.argv[2].split(",") if c]
    result = measure_sync(MPI.COMM_WORLD, counts, int(sys.argv[3]))
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps({str(k): v for k, v in result.items()}), flush=True)


def measure_sync_here(counts: list[int], floats: int, timeout: float = 120.0) -> dict[int, float]:
    """measure_sync in a helper mpiexec job on this host (the CLI runs outside MPI)."""
    from pal_hpc.cluster.launch import mpi_env, mpiexec

    if not counts:
        return {}
    cmd = mpiexec(max(counts), "-m", "pal_hpc.plan", "--sync-probe",
                  ",".join(map(str, counts)), str(floats))
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             env=mpi_env())
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the Allreduce probe ({' '.join(cmd)}) did not finish within "
                           f"{timeout:.0f} s") from None
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"the Allreduce probe failed (exit {out.returncode}): "
                           f"{(out.stderr or out.stdout)[-1500:]}")
    return {int(k): float(v) for k, v in json.loads(lines[-1]).items()}


# ---------------------------------------------------------------------------------------
# At start-up: `--actors-per-node auto` / `--learners-per-node auto`.

def layout_from_table(table: list[tuple[int, int, int]], ranks_per_node: int = 0
                      ) -> tuple[Layout, list[int]]:
    """The Layout from `table[world_rank] = (host leader rank, rank on the host, host
    cores)`, with virtual nodes of `ranks_per_node` as `build_topology` cuts them, and
    the ranks in the order learners fill them (first rank of every node, then the
    second...), for measure_sync.  Nodes are numbered by their lowest world rank."""
    key_of = [(lead, local // ranks_per_node if ranks_per_node > 0 else 0)
              for lead, local, _ in table]
    leaders = sorted({key: min(r for r, k in enumerate(key_of) if k == key)
                      for key in set(key_of)}.items(), key=lambda kv: kv[1])
    node_of = {key: i for i, (key, _) in enumerate(leaders)}
    host_leaders = sorted({lead for lead, _, _ in table})
    host_of = {lead: i for i, lead in enumerate(host_leaders)}
    cores = [0.0] * len(host_leaders)
    for lead, _, c in table:
        cores[host_of[lead]] = float(c)
    sizes, hosts = [0] * len(node_of), [0] * len(node_of)
    position = []
    for r, key in enumerate(key_of):
        node = node_of[key]
        position.append((sizes[node], node, r))
        sizes[node] += 1
        hosts[node] = host_of[key[0]]
    order = [r for _, _, r in sorted(position)]
    return Layout(tuple(sizes), tuple(hosts), tuple(cores)), order


def _host_table(world) -> list[tuple[int, int, int]]:
    """Collective: every rank's (host leader, rank on the host, the host's cores)."""
    from mpi4py import MPI

    rank = world.Get_rank()
    host = world.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    try:
        cpus = set().union(*host.allgather(sorted(os.sched_getaffinity(0))))
        leader = host.bcast(rank, root=0)
        local = host.Get_rank()
    finally:
        host.Free()
    return world.allgather((leader, local, len(cpus)))


def split_from_checkpoint(cfg, layout: Layout) -> tuple[tuple[int, ...], str] | None:
    """The learners per node of the checkpoint a resume will read (newest first), if
    it fits this layout: a resumed run keeps the split it started with (its replay
    regions and roles must match).  None when there is none or it does not fit."""
    import h5py

    from pal_hpc.io import checkpoint as ckpt

    if cfg.resume in ("latest", "auto"):
        paths = list(reversed(ckpt.list_checkpoints(cfg.resolved_run_dir())))
    else:
        paths = [cfg.resume]
    for path in paths:
        try:
            with h5py.File(path, "r") as f:
                saved = json.loads(f.attrs["layout"])      # [[node, is_actor, is_learner]]
        except (OSError, KeyError, ValueError):
            continue
        counts: dict[int, list[int]] = {}
        for node, _, is_learner in saved:
            counts.setdefault(node, [0, 0])
            counts[node][0] += 1
            counts[node][1] += int(is_learner)
        by_size: dict[int, int] = {}
        for size, n in counts.values():
            by_size.setdefault(size, n)
            if by_size[size] != n:
                return None
        if sorted(size for size, _ in counts.values()) != sorted(layout.sizes) \
                or any(by_size[s] >= s for s in by_size if s > 1):
            return None
        return tuple(by_size[s] for s in layout.sizes), str(path)
    return None


def plan_at_startup(world, cfg) -> dict | None:
    """Collective: the plan when a per-node count is auto, else None (nothing done).

    Rank 0 measures (the others sleep), the Allreduce cost is measured among the job's
    ranks, rank 0 decides and every rank gets the same plan: build_topology takes its
    "split".  A resumed run keeps its checkpoint's split.  Rank 0 prints one line."""
    if AUTO not in (cfg.actors_per_node, cfg.learners_per_node):
        return None
    from pal_hpc.cluster.collectives import wait_all

    rank = world.Get_rank()
    layout, order = layout_from_table(_host_table(world), cfg.ranks_per_node)
    splits = all_splits(layout, cfg.actors_per_node, cfg.learners_per_node)  # same everywhere
    measured = err = kept = None
    if rank == 0:
        try:
            kept = split_from_checkpoint(cfg, layout) if cfg.resume else None
            measured = measure_rates(cfg)
        except ConfigError as exc:
            err = str(exc)
    wait_all(world)                           # the others sleep while rank 0 measures
    err, floats = world.bcast((err, measured.gradient_floats if measured else 0), root=0)
    if err:
        raise ConfigError(err)
    sync = measure_sync(world, sync_counts(layout, splits), floats, order)
    plan = None
    if rank == 0:
        measured.sync_s = sync
        # Other programs' load is seen on rank 0's host (host 0) only.
        layout = dataclasses.replace(layout, others=tuple(
            others_from_share(c, measured.cpu_share) if h == 0 else 0.0
            for h, c in enumerate(layout.cores)))
        plan = make_plan(layout, measured.rates(), cfg.batch_size, cfg.replay_ratio,
                         cfg.actors_per_node, cfg.learners_per_node,
                         forced=kept[0] if kept else None)
        plan["inputs"].update(_details(measured), envs_per_actor=cfg.envs_per_actor)
        plan["source"] = f"checkpoint {kept[1]}" if kept else "measured"
        print(f"pal_hpc: plan: {plan['describe']}"
              + (f" (kept from {kept[1]})" if kept else "")
              + f"; predicted {plan['env_steps_per_s']:,.0f} env steps/s, "
                f"{plan['updates_per_s']:,.0f} updates/s, {plan['bottleneck']} the limit "
                f"(measured in {measured.measure_s:.1f} s; python -m pal_hpc.plan shows "
                "every split)", flush=True)
    return world.bcast(plan, root=0)


def _details(m: Measured) -> dict:
    """The measurements that are not model inputs, for the record."""
    d = asdict(m)
    for key in ("actor_step_s", "update_s", "phases_per_update", "sync_s"):
        d.pop(key)
    return d


# ---------------------------------------------------------------------------------------
# The command line.

def format_plan(plan: dict, title: str) -> str:
    """The table of every split, the recommended and the default one marked."""
    inp = plan["inputs"]
    us = lambda s: f"{s * 1e6:,.1f} us" if s < 1e-3 else f"{s * 1e3:,.2f} ms"  # noqa: E731
    sync = ", ".join(f"{n} learners {us(s)}" for n, s in
                     sorted(((int(n), s) for n, s in inp["sync_s"].items()))) or "not needed"
    lines = [title,
             f"measured (median CPU time, {inp.get('measure_s', 0):.1f} s): env step "
             f"{us(inp['env_step_s'])}, policy forward on {inp['envs_per_actor']} obs "
             f"{us(inp['forward_s'])}, replay insert {us(inp['insert_s'])}/transition",
             f"  a = actor per env step {us(inp['actor_step_s'])};  u = learner update "
             f"{us(inp['update_s'])} ({inp['phases_per_update']:g} phase(s), {inp['device']})",
             f"  r = Allreduce per phase (wall, learners polling it every 20 us): {sync}",
             f"  cores: {', '.join(f'{c:g}' for c in inp['host_cores'])} (os.sched_getaffinity)"
             f";  batch {inp['batch_size']}, replay ratio {inp['replay_ratio']:g}",
             f"  other programs: {', '.join(f'{x:.1f}' for x in inp['host_others'])} busy "
             f"processes (the measurement got {inp.get('cpu_share', 1.0):.0%} of a core)"]
    lines.append("")
    header = f"{'split':<40} {'env steps/s':>12} {'updates/s':>10} " \
             f"{'grad batches/s':>15}  bottleneck"
    lines += [header, "-" * len(header)]
    for row in plan["table"]:
        marks = []
        if row["split"] == plan["split"]:
            marks.append("<- recommended")
        if row["split"] == plan["default"]["split"]:
            marks.append("(default split)")
        lines.append(f"{row['describe']:<40} {row['env_steps_per_s']:>12,.0f} "
                     f"{row['updates_per_s']:>10,.1f} {row['gradient_batches_per_s']:>15,.1f}"
                     f"  {row['bottleneck']:<9} {' '.join(marks)}".rstrip())
    flags = ""
    if len(plan["split"]) == 1:
        learners, actors = next(iter(plan["split"].values()))
        flags = f" (--learners-per-node {learners} --actors-per-node {actors})"
    lines += ["", f"recommended: {plan['describe']}{flags}: predicted "
                  f"{plan['env_steps_per_s']:,.0f} env steps/s, {plan['updates_per_s']:,.1f} "
                  f"updates/s, limited by the {plan['bottleneck']}",
              "(ranked by updates/s: more learners average more batches per update, so "
              "updates per env step fall; the model does not predict learning speed)"]
    return "\n".join(lines)


def _parser():
    from pal_hpc.config import build_parser

    parser = build_parser(prog="python -m pal_hpc.plan")
    parser.description = ("Measure one actor and one learner on this machine for this "
                          "configuration and predict every actor/learner split "
                          "(see the module docstring for the model).")
    group = parser.add_argument_group("planner")
    for flag, kw in _PLAN_FLAGS.items():
        group.add_argument(flag, **kw)
    return parser


_PLAN_FLAGS = {
    "--ranks": dict(type=int, required=True, metavar="N",
                    help="ranks of the job (mpiexec -n N); --ranks-per-node K splits them "
                         "into virtual nodes"),
    "--cores": dict(type=float, default=None, metavar="C",
                    help="cores of the host (default: os.sched_getaffinity)"),
    "--others": dict(type=float, default=None, metavar="X",
                     help="busy processes of other programs on the host (default: "
                          "estimated from the CPU share the measurement got; 0 = a quiet "
                          "machine)"),
    "--budget": dict(type=float, default=3.0, metavar="S",
                     help="seconds of measurement, about (default: 3)"),
    "--json": dict(action="store_true", help="print the plan as JSON instead of a table"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--sync-probe"]:
        _sync_probe_main()
        return 0
    from pal_hpc.config import load_config

    ns = _parser().parse_args(argv)          # --help, and argparse's errors, from here
    own = argparse.ArgumentParser(add_help=False)
    for flag, kw in _PLAN_FLAGS.items():
        own.add_argument(flag, **{k: v for k, v in kw.items() if k != "required"})
    _, rest = own.parse_known_args(argv)
    try:
        cfg = load_config(rest)
        if ns.ranks < 1:
            raise ConfigError(f"ranks: must be >= 1, got {ns.ranks}")
        cores = ns.cores if ns.cores is not None else len(os.sched_getaffinity(0))
        if not cores > 0:
            raise ConfigError(f"cores: must be > 0, got {ns.cores}")
        if ns.others is not None and not ns.others >= 0:
            raise ConfigError(f"others: must be >= 0, got {ns.others}")
        layout = Layout.one_host(ns.ranks, cores, cfg.ranks_per_node)
        splits = all_splits(layout, cfg.actors_per_node, cfg.learners_per_node)
        measured = measure_rates(cfg, budget_s=ns.budget)
        others = (ns.others if ns.others is not None
                  else others_from_share(cores, measured.cpu_share))
        layout = dataclasses.replace(layout, others=(others,))
    except ConfigError as exc:
        print(f"pal_hpc.plan: invalid configuration: {exc}", file=sys.stderr)
        return 2
    measured.sync_s = measure_sync_here(sync_counts(layout, splits), measured.gradient_floats)
    plan = make_plan(layout, measured.rates(), cfg.batch_size, cfg.replay_ratio,
                     cfg.actors_per_node, cfg.learners_per_node)
    plan["inputs"].update(_details(measured), envs_per_actor=cfg.envs_per_actor)
    plan["source"] = "measured"
    if ns.json:
        print(json.dumps(plan, indent=1))
    else:
        nodes = len(layout.sizes)
        print(format_plan(plan, f"pal_hpc.plan: {cfg.algo} on {cfg.env}, {ns.ranks} ranks "
                                f"on {_n(nodes, 'node')} "
                                f"({' + '.join(map(str, layout.sizes))} ranks)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
