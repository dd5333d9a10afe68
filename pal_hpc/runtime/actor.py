"""Actor: steps a few environments with one batched forward pass of its policy per
step and writes n-step transitions into its node's shared replay in batches.  The
policy (the algorithm's) owns exploration.  The actor adopts new weights when the
node's learner has published a newer version (one atomic load per step, no MPI call)."""

from __future__ import annotations

import time

import numpy as np

from pal_hpc.envs import make_env
from pal_hpc.replay.frames import FrameStackReplay
from pal_hpc.runtime.nstep import FrameRows, NStep


class Actor:
    """One actor rank's environments, policy copy and replay writer."""

    def __init__(self, cfg, policy, replay, region: int, weights, actor_index: int,
                 n_actors: int, write_batch: int = 32):
        self.cfg = cfg
        self.policy = policy                # its parameters come from `weights`
        self.replay = replay
        self.region = region
        self.weights = weights
        self.actor_index = actor_index
        self.n_actors = n_actors
        self.write_batch = write_batch
        # Inserts an actor may run ahead of the learners: a few write batches per actor.
        self.slack = max(4 * write_batch * max(1, replay.regions), cfg.batch_size)
        base = cfg.seed * 100_003 + 1_000 * actor_index
        self.envs = [make_env(cfg.env, base + i,
                              terminal_on_life_loss=cfg.atari_terminal_on_life_loss)
                     for i in range(cfg.envs_per_actor)]
        self.rng = np.random.default_rng(base)
        self.obs = np.stack([env.reset(seed=base + i)[0] for i, env in enumerate(self.envs)])
        # A frame replay takes each env's rows as a stream of its own (one frame each).
        self.frame_rows = isinstance(replay, FrameStackReplay)
        self.nsteps = [(FrameRows if self.frame_rows else NStep)(cfg.n_step, cfg.gamma)
                       for _ in self.envs]
        self._stream_rows: list[list[tuple]] = [[] for _ in self.envs]
        self.clip_rewards = bool(getattr(cfg, "reward_clip", False))
        self.ep_return = np.zeros(len(self.envs))
        self.ep_length = np.zeros(len(self.envs), np.int64)
        self.version = 0
        self._params = np.empty(policy.num_params, np.float32)
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
            self.policy.set_flat_params(self._params)
            return True
        return False

    def step(self, global_steps: float) -> None:
        """One step of every environment."""
        self.pull_weights()
        actions = self.policy.act(self.obs, self.rng, global_steps)
        for i, env in enumerate(self.envs):
            a = actions[i]
            next_obs, reward, terminated, truncated, _ = env.step(a)
            self.ep_return[i] += reward
            self.ep_length[i] += 1
            # Learning may see clipped rewards; the logged return stays the env's.
            learn_r = float(np.clip(reward, -1.0, 1.0)) if self.clip_rewards else reward
            if self.frame_rows:
                # Rows keep only obs_t[-1] (FrameRows copies it).
                rows = self.nsteps[i].push(self.obs[i], a, learn_r, next_obs, terminated,
                                           truncated)
                self._stream_rows[i] += rows
                self._pending += rows
            else:
                # A copy: self.obs[i] is overwritten below, and the transition keeps obs_t.
                self._pending += self.nsteps[i].push(self.obs[i].copy(), a, learn_r, next_obs,
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
        t0 = time.perf_counter()
        if self.frame_rows:
            self._flush_streams()
            self.insert_times.append(time.perf_counter() - t0)
            self._pending.clear()
            return
        obs, action, ret, next_obs, discount = zip(*self._pending)
        spec = self.replay.spec
        self.replay.add(self.region, {
            "obs": np.asarray(obs, dtype=spec["obs"][1]),
            "action": np.asarray(action, dtype=spec["action"][1]),
            "reward": np.asarray(ret, dtype=np.float32),
            "next_obs": np.asarray(next_obs, dtype=spec["next_obs"][1]),
            "discount": np.asarray(discount, dtype=np.float32),
        })
        self.insert_times.append(time.perf_counter() - t0)
        self._pending.clear()

    def _flush_streams(self) -> None:
        """One add per environment: its rows, in order, into its own stream."""
        adt = self.replay.spec["action"][1]
        for i, rows in enumerate(self._stream_rows):
            if not rows:
                continue
            frame, action, ret, discount, k, start = zip(*rows)
            self.replay.add(self.region, {
                "obs": np.stack(frame), "action": np.asarray(action, dtype=adt),
                "reward": np.asarray(ret, dtype=np.float32),
                "discount": np.asarray(discount, dtype=np.float32),
                "nstep": np.asarray(k, dtype=np.int64),
                "episode_start": np.asarray(start, dtype=bool)}, stream=i)
            rows.clear()

    def drain_episodes(self) -> list[tuple[float, int]]:
        out, self.finished = self.finished, []
        return out

    def close(self) -> None:
        for env in self.envs:
            env.close()


__all__ = ["Actor"]
