"""Shared by the frame-replay tests: environments whose frames carry a stamp,
stepped through gymnasium's FrameStackObservation, written into a
FrameStackReplay with FrameRows and, beside it, the non-deduplicated reference
(NStep over the full stacks the env returned)."""

import gymnasium as gym
import numpy as np

from pal_hpc.runtime.nstep import FrameRows, NStep


class StampEnv(gym.Env):
    """Frames (8, 8) uint8 with a unique stamp per (env, emitted frame); episodes end
    by termination with probability p_term per step (truncation comes from TimeLimit)."""

    observation_space = gym.spaces.Box(0, 255, (8, 8), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, env_id: int, p_term: float = 0.05):
        self.env_id, self.p_term, self.count = env_id, p_term, 0
        self._rng = np.random.default_rng(env_id)

    def _frame(self):
        self.count += 1
        f = self._rng.integers(0, 256, (8, 8), dtype=np.uint8)
        f[0, :4] = np.frombuffer(np.int32(self.count).tobytes(), np.uint8)
        f[0, 4] = self.env_id
        return f

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._frame(), {}

    def step(self, action):
        return self._frame(), float(self._rng.normal()), bool(self._rng.random() < self.p_term), \
            False, {}


def stamp_env(env_id: int, max_steps: int = 25, stack: int = 4) -> gym.Env:
    env = gym.wrappers.TimeLimit(StampEnv(env_id), max_episode_steps=max_steps)
    return gym.wrappers.FrameStackObservation(env, stack)


class Streams:
    """E environments feeding one region of a FrameStackReplay, with the reference
    transitions kept per slot (the latest written there)."""

    def __init__(self, rb, region, envs, n_step, gamma=0.9, seed=0):
        self.rb, self.region, self.envs = rb, region, envs
        self.rows = [FrameRows(n_step, gamma) for _ in envs]
        self.refs = [NStep(n_step, gamma) for _ in envs]
        self.obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
        self.pending = [[] for _ in envs]       # (row, reference transition or None)
        self.rng = np.random.default_rng(seed)
        self.by_slot: dict[int, tuple] = {}     # slot -> reference transition
        self.steps = 0
        self.ends = {"terminated": 0, "truncated": 0}

    def step(self):
        for i, env in enumerate(self.envs):
            a = int(self.rng.integers(env.action_space.n))
            nxt, r, term, trunc, _ = env.step(a)
            rows = self.rows[i].push(self.obs[i], np.int64(a), r, nxt, term, trunc)
            refs = self.refs[i].push(self.obs[i].copy(), a, r, nxt.copy(), term, trunc)
            it = iter(refs)
            self.pending[i] += [(row, next(it) if row[4] > 0 else None) for row in rows]
            if term or trunc:
                self.ends["terminated" if term else "truncated"] += 1
                nxt, _ = env.reset()
            self.obs[i] = nxt
        self.steps += 1

    def flush(self):
        for i, items in enumerate(self.pending):
            if not items:
                continue
            rows = [row for row, _ in items]
            frame, action, ret, disc, k, start = zip(*rows)
            slots = self.rb.add(self.region, {
                "obs": np.asarray(frame), "action": np.asarray(action, np.int64),
                "reward": np.asarray(ret, np.float32), "discount": np.asarray(disc, np.float32),
                "nstep": np.asarray(k), "episode_start": np.asarray(start)}, stream=i)
            for slot, (_, ref) in zip(slots.tolist(), items):
                self.by_slot[slot] = ref
            items.clear()


def check_sample(s, by_slot) -> list[str]:
    """Differences between sampled rows and the reference transitions of their slots."""
    bad = []
    for b, slot in enumerate(s["indices"].tolist()):
        ref = by_slot.get(slot)
        if ref is None:
            bad.append(f"slot {slot}: sampled, but it holds no transition")
            continue
        obs, action, ret, next_obs, disc = ref
        if not np.array_equal(s["obs"][b], obs):
            bad.append(f"slot {slot}: obs differs")
        if not np.array_equal(s["next_obs"][b], next_obs):
            bad.append(f"slot {slot}: next_obs differs")
        if s["action"][b] != action or s["reward"][b] != np.float32(ret) \
                or s["discount"][b] != np.float32(disc):
            bad.append(f"slot {slot}: small fields differ")
    return bad
