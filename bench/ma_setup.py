"""The multi-agent inference setup that both sides of bench/bench_multiagent.py run (ours
in .venv, Ray's in .venv-peers): the environment and the agents' policies.

Environment: MAgent2's `battle` (PettingZoo parallel API, magent2 on PyPI; a C++ grid
engine, so a step costs ~0.2 ms and the measurement is about the handoff, not the env),
two teams of N/2 agents, each agent a 13x13x5 float32 view and 21 discrete actions.
Agents hit to death leave `env.agents`, as PettingZoo's API has it.  battle_v4 places
its teams as squares (map_size=12: 2 per side); `battle(n)` places N/2 per side in one
column each, so 4 and 10 agents both exist.  The reactor paper's ma-gym
TrafficJunction10-v1 does not install (it needs gym<=0.20, whose setup.py no
setuptools of today accepts, and pins cloudpickle 2.0.0, which Ray's cannot share).

Policy, one per agent with its own weights (the paper's): an MLP obs -> 64 (ReLU) ->
n_actions, argmax, in float32 numpy on both sides (same code, same cost), weights drawn
from the agent's seed.
"""

from __future__ import annotations

import numpy as np


class MLPPolicy:
    """obs (flattened) -> 64 ReLU -> n_actions, argmax; weights uniform in +-1/sqrt(fan_in)
    from `seed` (torch's nn.Linear default range)."""

    def __init__(self, obs_dim: int, n_actions: int, seed: int, hidden: int = 64):
        rng = np.random.default_rng(seed)
        k1, k2 = 1 / np.sqrt(obs_dim), 1 / np.sqrt(hidden)
        self.w1 = rng.uniform(-k1, k1, (obs_dim, hidden)).astype(np.float32)
        self.b1 = rng.uniform(-k1, k1, hidden).astype(np.float32)
        self.w2 = rng.uniform(-k2, k2, (hidden, n_actions)).astype(np.float32)
        self.b2 = rng.uniform(-k2, k2, n_actions).astype(np.float32)

    def __call__(self, obs) -> int:
        h = np.maximum(obs.reshape(-1) @ self.w1 + self.b1, 0)
        return int(np.argmax(h @ self.w2 + self.b2))


class PolicyMaker:
    """Builds agent i's MLPPolicy where it is called (a worker, a Ray actor)."""

    def __init__(self, obs_dim: int, n_actions: int, seed: int):
        self.obs_dim, self.n_actions, self.seed = obs_dim, n_actions, seed

    def __call__(self) -> MLPPolicy:
        return MLPPolicy(self.obs_dim, self.n_actions, self.seed)


def battle(num_agents: int, max_cycles: int = 1000, seed: int | None = None):
    """MAgent2 battle with num_agents (even) agents, num_agents/2 per team."""
    from magent2.environments.battle import battle

    if num_agents < 2 or num_agents % 2:
        raise ValueError(f"num_agents: {num_agents}; expected an even number >= 2")
    per_side = num_agents // 2
    size = max(12, 2 * per_side + 3)

    class _Battle(battle._parallel_env):
        def generate_map(self):
            mid, ys = size // 2, range(2, 2 + 2 * per_side, 2)
            left, right = self.handles[self.leftID], self.handles[self.rightID]
            self.env.add_agents(left, method="custom", pos=[[mid - 3, y, 0] for y in ys])
            self.env.add_agents(right, method="custom", pos=[[mid + 2, y, 0] for y in ys])

    env = _Battle(size, False, dict(battle.default_reward_args), max_cycles, False, None, seed)
    if len(env.possible_agents) != num_agents:
        raise RuntimeError(f"battle({num_agents}) placed {len(env.possible_agents)} agents")
    return env


def policy_makers(env, seed: int = 0) -> dict:
    """agent -> PolicyMaker, agent i seeded seed * 1000 + i."""
    out = {}
    for i, agent in enumerate(env.possible_agents):
        obs = env.observation_space(agent)
        out[agent] = PolicyMaker(int(np.prod(obs.shape)), int(env.action_space(agent).n),
                                 seed * 1000 + i)
    return out
