"""The planner's measurements: what one actor and one learner cost on this machine.

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
- g(L): wall seconds per update of L learners working at once, in the same places: each
  runs the algorithm's real update on its share of the batch (`UpdateStandIn`: every
  phase's gradient on fixed random rows, the Allreduce, the optimizer step).  On fewer free cores than learners the phases end one after another
  (a phase ends at the last learner's gradient; a reduction waits for a member that
  is not running), which u and r(L) measured apart do not show: TD3 at -n 4 on 2
  cores took 19 ms per update with 3 learners of 86 rows and 10 ms with 2 of 128; a
  learner's u is 4.4 and 6.7 ms alone.  (A CPU-burning stand-in for the work measured
  11 ms for 3: time-sharing a core also costs its caches, which only the real
  arithmetic shows.)
- C_h: cores of host h (`os.sched_getaffinity`, the union over the host's ranks).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from pal_hpc.config import ConfigError
from pal_hpc.plan.model import Rates
# How long an idle rank sleeps between loop turns.
from pal_hpc.runtime.pacing import IDLE_SLEEP as SLEEP_S
from pal_hpc.runtime.threads import limit_threads

STEADY_STEPS = 1e12                         # global steps: past every exploration schedule



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
    update_by_rows: dict[int, float] = field(default_factory=dict)   # u at each share
    gang_s: dict[int, float] = field(default_factory=dict)   # L learners at once (wall)

    def rates(self) -> Rates:
        return Rates(self.actor_step_s, self.update_s, self.phases_per_update,
                     tuple(sorted(self.sync_s.items())), self.wake_s / self.sleep_s,
                     tuple(sorted(self.update_by_rows.items())),
                     tuple(sorted(self.gang_s.items())))


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
    limit_threads(cfg.torch_threads)
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
    capacity = min(cfg.replay_capacity or 1_000_000,      # 0 = auto (Atari DQN)
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
        count, rows = [0], [cfg.batch_size]

        def update():
            i = count[0]
            count[0] += 1
            batch = replay.sample(rows[0], beta=cfg.per_beta, rng=rng)
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
        # With the split batch a learner's update is on its share: u at the shares of
        # 2, 4 and 8 learners too (the planner interpolates between them).
        by_rows = {cfg.batch_size: update_s}
        if cfg.learner_batch == "split":
            for n in (2, 4, 8):
                rows[0] = -(-cfg.batch_size // n)
                if rows[0] not in by_rows:
                    cpu, wall = _time_calls(update, 0.3 * share, multiple=10, sync=cuda_sync)
                    by_rows[rows[0]] = wall if device.type == "cuda" else cpu
    finally:
        if actor is not None:
            actor.close()
        replay.close()

    phases = float(np.mean([len(ps) for ps in phase_lists]))
    return Measured(
        # One loop iteration per actor step (of envs_per_actor envs), one per phase.
        actor_step_s=actor_step_s + loop_s / cfg.envs_per_actor,
        update_s=update_s + phases * loop_s, phases_per_update=phases,
        update_by_rows={r: t + phases * loop_s for r, t in by_rows.items()},
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


def phase_period(phase_counts: list[int]) -> list[int]:
    """The shortest repeating prefix of the phases per update ([1, 2, 1, 2] -> [1, 2])."""
    for p in range(1, len(phase_counts) + 1):
        if all(c == phase_counts[i % p] for i, c in enumerate(phase_counts)):
            return phase_counts[:p]
    return phase_counts


def gang_rows(counts: list[int], batch_size: int, split: bool) -> dict[int, int]:
    """The rows of each learner's batch among L (for measure_gang): its share with the
    split batch, the whole batch without it."""
    return {n: -(-batch_size // n) if split else batch_size for n in counts}


class UpdateStandIn:
    """A learner's real update without the replay, for timing learners side by side
    (probe.measure_gang): the configured algorithm, built here on the CPU, takes every
    phase's gradient on one fixed batch of `rows` random transitions of the run's
    spec and applies the reduced gradient -- the same arithmetic, memory traffic and
    optimizer step as a learner's update, minus sampling and priorities (a few % of
    it, in `u`)."""

    def __init__(self, cfg, rows: int):
        import torch

        from pal_hpc.algos import ALGOS
        from pal_hpc.envs import action_info, make_env, obs_info
        from pal_hpc.runtime.nstep import transition_spec

        limit_threads(cfg.torch_threads)
        torch.set_flush_denormal(True)
        Algo = ALGOS[cfg.algo]
        env = make_env(cfg.env, cfg.seed, terminal_on_life_loss=cfg.atari_terminal_on_life_loss)
        try:
            spec = transition_spec(*obs_info(env), *action_info(env))
            self.algo = Algo(env.observation_space, env.action_space, cfg.algo_config,
                             device="cpu", seed=cfg.seed)
        finally:
            env.close()
        rng = np.random.default_rng(cfg.seed)
        self.batch = random_transitions(spec, rows, rng, cfg.gamma, cfg.n_step,
                                        self.algo.act_space)
        self.batch["weights"] = np.ones(rows, np.float32)
        self.phase_lists = [self.algo.phases(i) for i in range(8)]
        self.period = len(phase_period([len(ps) for ps in self.phase_lists]))
        size = max(self.algo.phase_size(p) for ps in self.phase_lists for p in ps)
        self.send = np.zeros(size + 3, np.float32)     # + the learner's three vote slots
        self.recv = np.empty_like(self.send)

    def gradient(self, phase: str) -> int:
        """Phase `phase`'s gradient into send[:n]; returns n."""
        n = self.algo.phase_size(phase)
        self.algo.compute_gradients(phase, self.batch, out=self.send[:n])
        return n

    def apply(self, phase: str, n: int, scale: float) -> None:
        self.algo.apply_gradients(phase, self.recv[:n], scale)


def details(m: Measured) -> dict:
    """The measurements that are not model inputs, for the record."""
    d = asdict(m)
    for key in ("actor_step_s", "update_s", "phases_per_update", "sync_s", "update_by_rows",
                "gang_s"):
        d.pop(key)
    return d
