"""How a node's environments are shared between its master and its environment workers:
`--num-envs` and `--master-envs` resolved for a node of `workers` worker ranks.

The master's share (`--master-envs`): envs [0, m) of the node are stepped by the master
itself, inside `step_wait`, while the workers step theirs; the workers share the rest
evenly.  Which process steps an env changes nothing it yields (each env is stepped with
its own seed and action, and next-step autoreset is per env): runs with and without a
share are bit-identical.  What it changes is the round's time: for small envs the
lockstep handoff, not the env, sets it, and the master's share needs no handoff.

`auto` (the rule, from bench/bench_master_share.py and PAAC CartPole runs on a 2-core
machine; docs/paac.md has the numbers): every process of the node steps the same
number of environments, the master n / (W + 1) of them, rounded so that the workers
still share the rest evenly -- unless rank 0's host runs more ranks than it has cores,
where a share was slower (the master's stepping takes a core a worker needs) and auto
is no share.  With one worker (half the envs on the master) it stepped CartPole 1.35x
and Pong 1.70x as fast as the same ranks without a share.
"""

from __future__ import annotations

import os

from pal_hpc.algos.paac import NUM_ENVS, resolve_num_envs
from pal_hpc.config import AUTO, ConfigError

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


def node_layout(num_envs: int, master_envs, workers: int,
                crowded: bool = False) -> tuple[int, int]:
    """(environments of the node, the master's share of them) for a node of `workers`
    worker ranks (`crowded`: its host has fewer cores than ranks; auto is then 0).  `num_envs` 0 = auto (the paper's 32, rounded so the workers share
    what the master leaves evenly); with no workers the master steps every env.
    Raises ConfigError naming num_envs or master_envs when they do not fit (the value
    itself is checked by Config.validate)."""
    if workers == 0:
        n = resolve_num_envs(num_envs, 0)
        return n, n
    if master_envs == AUTO and crowded:
        return resolve_num_envs(num_envs, workers), 0
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
                          f"num_envs of {m + max(workers, rest - rest % workers)}")
    return num_envs, m
