"""The planner's model: pure functions from measured rates to every split's prediction.

The model (steady state of the rate limiter; pure functions: `predict`, `recommend`)
------------------------------------------------------------------------------------
Every update is synchronous over all learners of the job: U updates/s, each learner
sampling `batch` transitions per update.  The rate limiter (sampled = ratio x inserted
on each node, learners and actors both held to it) ties node n's env steps to U:

    S_n = U * k_n,   k_n = L_n * batch / ratio          (env steps per update on node n)

With the split batch (--learner-batch split, the runtime's default) the L learners
share one `batch` instead: a learner's update costs u(ceil(batch / L)), measured at the
shares of 1, 2, 4 and 8 learners and interpolated in rows, and k_n = L_n * batch /
(L * ratio).  `predict(..., split=True)`; without it, the `full` behaviour above.

A rank needs, per update, d CPU-seconds and z seconds asleep in the Allreduce:

    learner:  d = u,              z = P * r(L)      every learner does every update
    actor:    d = k_n * a / A_n,  z = 0             node n's A_n actors share its steps
    solo:     d = k_n * a + u,    z = P * r(L)      a 1-rank node acts and learns

(L = sum_n L_n learners in the job, P phases per update; r = 0 for one learner.)  It
computes at c_h of a core, the fair share Linux's scheduler gives each busy process of
host h: c_h = min(1, C_h / (X_h + B_h)), B_h = the sum over the host's ranks of their
busy fraction b + (1 - b) * w, b = min(1, U * d / c_h) (asleep, a rank still wakes),
X_h the busy processes of other programs (the largest fixed point).  U is the largest rate at which every rank's second holds its work:

    U * max(d / c_h + z, g) <= 1                        for every rank

where g = g(L), measured, for a learner (0 for an actor): the wall time per update of
the L learners computing and reducing at once where the roles put them.  Fair shares
assume the cores' time is divided finely; learners whose phases are a few ms long are
not -- with 3 learners on 2 cores, two compute, the third after them, and every phase
waits for it -- and g holds that.

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

import itertools
import math
from dataclasses import dataclass

from pal_hpc.config import AUTO, ConfigError

KINDS = ("learners", "actors", "cores")     # bottleneck names, in tie order
TIE = 0.05            # relative: predictions this close are equal (measurement noise)
MAX_SPLITS = 200_000


@dataclass(frozen=True)
class Rates:
    """The measured inputs of the model, in seconds (see the module docstring)."""

    actor_step_s: float                     # a: actor CPU-seconds per env step
    update_s: float                         # u: learner seconds per update
    phases_per_update: float = 1.0          # P: Allreduces per update
    sync_s: tuple[tuple[int, float], ...] = ()   # (L, r(L)): seconds per phase's Allreduce
    idle_cpu: float = 0.0                   # w: cores a sleeping rank uses waking up
    # (rows, u(rows)): a learner's seconds per update on a share of `rows` transitions
    # (--learner-batch split); interpolated in rows, update_s where nothing was measured.
    update_by_rows: tuple[tuple[int, float], ...] = ()
    # (L, g(L)): wall seconds per update of L learners working at once where the roles
    # put them (measure_gang); a floor under the learners' time per update.
    gang_s: tuple[tuple[int, float], ...] = ()


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


def gang_time(rates: Rates, learners: int) -> float:
    """g(L): the measured wall seconds per update of `learners` learners at once; 0
    (no floor) for one learner or when nothing was measured.  Linear in L between
    measured counts, the nearest measured count's value outside them."""
    points = sorted((n, g) for n, g in rates.gang_s if n >= 2)
    if learners <= 1 or not points:
        return 0.0
    if learners <= points[0][0]:
        return points[0][1]
    for (n0, g0), (n1, g1) in zip(points, points[1:]):
        if n0 <= learners <= n1:
            return g0 + (learners - n0) / (n1 - n0) * (g1 - g0)
    return points[-1][1]


def update_time(rates: Rates, rows: int) -> float:
    """u(rows): a learner's seconds per update on `rows` transitions, linear in rows
    between the measured shares (clamped at the ends); `update_s` without them."""
    points = sorted(rates.update_by_rows)
    if not points:
        return rates.update_s
    if rows <= points[0][0]:
        return points[0][1]
    for (r0, u0), (r1, u1) in zip(points, points[1:]):
        if r0 <= rows <= r1:
            return u0 + (rows - r0) / (r1 - r0) * (u1 - u0)
    return points[-1][1] * rows / points[-1][0]


def predict(layout: Layout, learners: tuple[int, ...], rates: Rates, batch_size: int,
            replay_ratio: float, split: bool = False) -> Prediction:
    """Env steps/s, updates/s and the bottleneck of the job with `learners[i]` learner
    ranks on node i (1-rank nodes: 1, solo) -- the model of the module docstring.
    `split` (--learner-batch split): an update is one `batch_size` shared by the L
    learners, so each costs u(ceil(batch / L)) and node n samples L_n / L of the batch."""
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
    total_learners = sum(learners)
    if split:
        u = update_time(rates, -(-batch_size // total_learners))
        k = [n * batch_size / (total_learners * replay_ratio) for n in learners]
    else:
        k = [n * batch_size / replay_ratio for n in learners]
    sync = rates.phases_per_update * sync_time(rates.sync_s, total_learners)
    gang = gang_time(rates, total_learners)
    # Rank groups: (host, ranks, CPU-seconds per update of each, sleep per update, kind,
    # the least wall seconds per update: g(L) for learners, 0 for actors).
    groups = []
    for host, size, kn, n, an in zip(layout.hosts, layout.sizes, k, learners, actors):
        if size == 1:
            groups.append((host, 1, kn * a + u, sync, "learners" if u + sync >= kn * a
                           else "actors", gang))
        else:
            groups.append((host, n, u, sync, "learners", gang))
            groups.append((host, an, kn * a / an, 0.0, "actors", 0.0))
    cores = layout.cores
    others = layout.others or (0.0,) * len(cores)
    hi = min(1.0 / max(d + z, f) for _, _, d, z, _, f in groups)   # every rank on a free core

    def shares(rate: float, limited: bool = True) -> list[float]:
        if not limited:
            return [1.0] * len(cores)
        return [fair_share([(rate * d, m) for g, m, d, _, _, _ in groups if g == h], c_h,
                           others[h], rates.idle_cpu) for h, c_h in enumerate(cores)]

    def slack(rate: float, limited: bool = True) -> list[float]:
        # Per group: 1 - the fraction of a second its ranks need (computing at their
        # share, plus sleeping in the Allreduce, at least g(L) for learners); negative =
        # infeasible.
        c = shares(rate, limited)
        return [1.0 - rate * max(d / c[g] + z, f) for g, _, d, z, _, f in groups]

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
              forced: tuple[int, ...] | None = None, split: bool = False) -> dict:
    """The plan as plain JSON: every split's prediction, the recommended one (or
    `forced`, a split kept from a checkpoint), the default split's, and the inputs."""
    splits = all_splits(layout, actors_per_node, learners_per_node)
    table = [predict(layout, s, rates, batch_size, replay_ratio, split) for s in splits]
    chosen = recommend(table)
    if forced is not None:
        chosen = predict(layout, forced, rates, batch_size, replay_ratio, split)
    default = predict(layout, default_split(layout), rates, batch_size, replay_ratio, split)

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
                       "learner_batch": "split" if split else "full",
                       "update_by_rows": {str(r): t for r, t in rates.update_by_rows},
                       "gang_s": {str(n): g for n, g in rates.gang_s},
                       "node_sizes": list(layout.sizes), "node_hosts": list(layout.hosts),
                       "host_cores": list(layout.cores),
                       "host_others": list(layout.others or (0.0,) * len(layout.cores))}}
