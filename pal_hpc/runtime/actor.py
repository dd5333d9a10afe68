"""Actor: steps a few environments with one batched forward pass per step,
epsilon-greedy with its own epsilon, and writes n-step transitions into its
node's shared replay in batches.  It adopts new weights when the node's learner
has published a newer version (one atomic load per step, no MPI call)."""

from __future__ import annotations

import time

import numpy as np

from pal_hpc.runtime.envs import make_env, obs_info
from pal_hpc.runtime.nstep import NStep


def actor_epsilon(cfg, actor_index: int, n_actors: int, global_steps: float) -> float:
    """Linear decay from eps_start to this actor's final epsilon over exploration_steps;
    final epsilons spread Ape-X style: eps_final ** (1 + eps_spread * i / (N - 1))."""
    spread = cfg.eps_spread * actor_index / (n_actors - 1) if n_actors > 1 else 0.0
    final = cfg.eps_final ** (1.0 + spread)
    frac = min(1.0, global_steps / cfg.exploration_steps) if cfg.exploration_steps > 0 else 1.0
    return cfg.eps_start + frac * (final - cfg.eps_start)


class Actor:
    """One actor rank's environments, policy copy and replay writer."""

    def __init__(self, cfg, algo, replay, region: int, weights, actor_index: int, n_actors: int,
                 write_batch: int = 32):
        self.cfg = cfg
        self.algo = algo                    # used for act(); parameters come from `weights`
        self.replay = replay
        self.region = region
        self.weights = weights
        self.actor_index = actor_index
        self.n_actors = n_actors
        self.write_batch = write_batch
        # Inserts an actor may run ahead of the learners: a few write batches per actor.
        self.slack = max(4 * write_batch * max(1, replay.regions), cfg.batch_size)
        base = cfg.seed * 100_003 + 1_000 * actor_index
        self.envs = [make_env(cfg.env, base + i) for i in range(cfg.envs_per_actor)]
        self.rng = np.random.default_rng(base)
        self.obs = np.stack([env.reset(seed=base + i)[0] for i, env in enumerate(self.envs)])
        self.nsteps = [NStep(cfg.n_step, cfg.gamma) for _ in self.envs]
        self.ep_return = np.zeros(len(self.envs))
        self.ep_length = np.zeros(len(self.envs), np.int64)
        self.version = 0
        self._params = np.empty(algo.num_params, np.float32)
        self._pending: list[tuple] = []
        self.steps = 0
        self.finished: list[tuple[float, int]] = []   # (return, length) since last drained
        self.insert_times: list[float] = []            # seconds per replay.add, for telemetry

    def may_insert(self) -> bool:
        """Rate limit (actor side, like Reverb's): stay within a small slack of what the
        node's learners have consumed, so the number of updates per env step -- and with
        it the learning curve -- does not depend on how fast each rank happens to run."""
        cfg = self.cfg
        allowed = cfg.learning_starts + self.replay.sampled() / cfg.replay_ratio + self.slack
        return self.replay.inserted() < allowed

    def pull_weights(self) -> bool:
        """Adopt the latest published parameters if they are newer; True if adopted."""
        if self.weights.version() > self.version:
            self.version = self.weights.read(self._params)
            self.algo.set_flat_params(self._params)
            return True
        return False

    def step(self, global_steps: float) -> None:
        """One step of every environment."""
        self.pull_weights()
        eps = actor_epsilon(self.cfg, self.actor_index, self.n_actors, global_steps)
        actions = self.algo.act(self.obs, np.full(len(self.envs), eps), self.rng)
        for i, env in enumerate(self.envs):
            a = int(actions[i])
            next_obs, reward, terminated, truncated, _ = env.step(a)
            self.ep_return[i] += reward
            self.ep_length[i] += 1
            # A copy: self.obs[i] is overwritten below, and the transition must keep obs_t.
            self._pending += self.nsteps[i].push(self.obs[i].copy(), a, reward, next_obs,
                                                 terminated, truncated)
            if terminated or truncated:
                self.finished.append((float(self.ep_return[i]), int(self.ep_length[i])))
                self.ep_return[i] = 0.0
                self.ep_length[i] = 0
                next_obs, _ = env.reset()
            self.obs[i] = next_obs
        self.steps += len(self.envs)
        if len(self._pending) >= self.write_batch:
            self.flush()

    def flush(self) -> None:
        """Write the completed transitions into this actor's replay region."""
        if not self._pending:
            return
        obs, action, ret, next_obs, discount = zip(*self._pending)
        spec = self.replay.spec
        t0 = time.perf_counter()
        self.replay.add(self.region, {
            "obs": np.asarray(obs, dtype=spec["obs"][1]),
            "action": np.asarray(action, dtype=np.int64),
            "reward": np.asarray(ret, dtype=np.float32),
            "next_obs": np.asarray(next_obs, dtype=spec["next_obs"][1]),
            "discount": np.asarray(discount, dtype=np.float32),
        })
        self.insert_times.append(time.perf_counter() - t0)
        self._pending.clear()

    def drain_episodes(self) -> list[tuple[float, int]]:
        out, self.finished = self.finished, []
        return out

    def close(self) -> None:
        for env in self.envs:
            env.close()


def evaluate(cfg, algo, episodes: int, seed: int) -> np.ndarray:
    """Greedy returns of `episodes` episodes on fresh environments (batched forward passes)."""
    envs = [make_env(cfg.env, seed + i) for i in range(episodes)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    returns = np.zeros(episodes)
    live = np.ones(episodes, bool)
    rng = np.random.default_rng(seed)
    zeros = np.zeros(episodes)
    while live.any():
        actions = algo.act(obs, zeros, rng)
        for i in np.flatnonzero(live):
            o, r, terminated, truncated, _ = envs[i].step(int(actions[i]))
            returns[i] += r
            obs[i] = o
            if terminated or truncated:
                live[i] = False
    for env in envs:
        env.close()
    return returns


__all__ = ["Actor", "actor_epsilon", "evaluate", "obs_info"]
