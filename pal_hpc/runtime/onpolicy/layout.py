"""How a node's environments are shared between its master and its environment workers:
`--num-envs` and `--master-envs` resolved for a node of `workers` worker ranks.

The master's share (`--master-envs`): envs [0, m) of the node are stepped by the master
itself, inside `step_wait`, while the workers step theirs; the workers share the rest
evenly.  Which process steps an env changes nothing it yields (each env is stepped with
its own seed and action, and next-step autoreset is per env): runs with and without a
share are bit-identical.  What it changes is the round's time: for small envs the
lockstep handoff, not the env, sets it, and the master's share needs no handoff.

`all`: the master steps every env of its node and the node's other ranks wait idle
(asleep, not polling) to the end: for envs so cheap that any handoff costs more than
the stepping it moves off the master.

`auto` (the rule, from measurements on a 2-core machine; docs/paac.md has the numbers):
  1. `all` when one lockstep step of the node's envs costs the master less than
     MASTER_ALONE_BELOW_S, timed on rank 0's probe env at start-up
     (`step_seconds`).  On CartPole-v1 (9 envs, about 0.1 ms a step) the master alone
     ran PAAC's loop 1.50x as fast as 3 workers stepping them at -n 4 (1.28x at -n 2);
  2. otherwise, when rank 0's host runs more ranks than it has cores, no share (the
     master's stepping takes a core a worker needs: a share was slower there), or
     the least one that lets the workers share the rest evenly;
  3. otherwise every process of the node steps the same number of environments, the
     master n / (W + 1) of them, rounded so that the workers still share the rest
     evenly.  With one worker (half the envs on the master) it stepped CartPole 1.35x
     and Pong 1.70x as fast as the same ranks without a share.
"""

from __future__ import annotations

import os
import time

from pal_hpc.algos.paac import NUM_ENVS, resolve_num_envs
from pal_hpc.config import ALL, AUTO, ConfigError

# auto keeps every env on the master when one lockstep step of them all costs it less
# than this: a handoff to a worker and back costs 15 us on a quiet core and hundreds of
# us when 4 processes share 2 cores, and the master waits for the slowest worker.
MASTER_ALONE_BELOW_S = 1e-3


def step_seconds(env, budget_s: float = 0.05, max_steps: int = 200) -> float:
    """Mean seconds of one `env.step` (resets included), timed over up to `max_steps`
    steps or `budget_s` seconds with random actions from the env's own action space,
    seeded 0 (the probe env is thrown away after; no training env is touched)."""
    env.action_space.seed(0)
    env.reset(seed=0)
    steps, t0 = 0, time.perf_counter()
    while steps < max_steps:
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        steps += 1
        if term or trunc:
            env.reset()
        if time.perf_counter() - t0 > budget_s:
            break
    return (time.perf_counter() - t0) / steps


def auto_share(num_envs: int, workers: int) -> int:
    """The master's share under auto: num_envs / (workers + 1), moved to the nearest
    value that leaves the workers a multiple of `workers` (at least one each)."""
    want = num_envs / (workers + 1)
    fits = [m for m in range(num_envs - workers + 1) if (num_envs - m) % workers == 0]
    return min(fits, key=lambda m: (abs(m - want), m))


def host_crowded(world) -> bool:
    """Rank 0 (others: None): whether its host runs more of the job's ranks than the
    cores it may use (collective: every rank sends its host's name)."""
    import socket

    names = world.gather(socket.gethostname(), root=0)
    if world.Get_rank() != 0:
        return None
    return names.count(names[0]) > len(os.sched_getaffinity(0))


def node_layout(num_envs: int, master_envs, workers: int, crowded: bool = False,
                step_s: float | None = None) -> tuple[int, int]:
    """(environments of the node, the master's share of them) for a node of `workers`
    worker ranks.  `crowded`: its host has fewer cores than ranks; `step_s`: seconds of
    one env step (`step_seconds`, for auto; None: not measured).  `num_envs` 0 = auto
    (the paper's 32, rounded so the workers share what the master leaves evenly); with
    no workers, or `all`, the master steps every env.  Raises ConfigError naming
    num_envs or master_envs when they do not fit (the value itself is checked by
    Config.validate)."""
    if workers == 0 or master_envs == ALL:
        n = resolve_num_envs(num_envs, 0)
        return n, n
    if master_envs == AUTO and step_s is not None:
        n = resolve_num_envs(num_envs, 0)
        if n * step_s < MASTER_ALONE_BELOW_S:
            return n, n
    if master_envs == AUTO and crowded:
        if num_envs == 0 or num_envs % workers == 0:
            return resolve_num_envs(num_envs, workers), 0
        if num_envs > workers:            # the least share that lets the workers share evenly
            return num_envs, num_envs % workers
    if master_envs == AUTO:
        n = resolve_num_envs(num_envs, 1)      # any count: the share absorbs the rest
        if num_envs == 0:
            n = NUM_ENVS
        if n < workers + 1:
            raise ConfigError(f"num_envs: {n} environments for a master and {workers} "
                              f"worker ranks under master_envs auto; at least "
                              f"{workers + 1}")
        return n, auto_share(n, workers)
    m = int(master_envs)
    if m == 0:
        return resolve_num_envs(num_envs, workers), 0
    if num_envs == 0:                          # auto: 32, the workers' part rounded up
        rest = max(NUM_ENVS - m, workers)
        return m + -(-rest // workers) * workers, m
    rest = num_envs - m
    if rest < workers or rest % workers:
        raise ConfigError(f"master_envs: {m} of num_envs {num_envs} leaves {rest} "
                          f"environments for {workers} worker ranks; they need a multiple "
                          f"of {workers} (at least {workers}): e.g. master_envs "
                          f"{num_envs % workers if num_envs > workers else 0} or a "
                          f"num_envs of {m + max(workers, rest - rest % workers)} (or "
                          f"master_envs all: the master steps every env, the workers "
                          f"idle)")
    return num_envs, m
