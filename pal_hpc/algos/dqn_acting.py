"""DQN's actor side without torch: the Ape-X epsilon schedule, epsilon-greedy
exploration, and the policy of an MLP Q-network in numpy (`MLPQPolicy`).

An actor acts on a few vectors a step, where torch's fixed cost per op is nearly all
of a small network's forward pass: 8 Blackjack observations through the reactor
paper's 3-32-2 network take 76 us through torch, a few through numpy (Zen 4, one
thread).  And an actor rank with no torch starts without importing it (2.6 CPU-s and
~160 MB a rank on a 2-core EPYC; `AlgoSpec.numpy_policy`).  The Q-values agree with
`pal_hpc.algos.dqn.QNetwork`'s to float32 rounding (tests/test_dqn.py).  Frames (a CNN
torso) act through torch (`pal_hpc.algos.dqn.DQNPolicy`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pal_hpc.algos.policy import Policy


def actor_epsilon(cfg, actor_index: int, n_actors: int, global_steps: float) -> float:
    """Linear decay from eps_start to this actor's final epsilon over exploration_steps;
    final epsilons spread Ape-X style: eps_final ** (1 + eps_spread * i / (N - 1))."""
    spread = cfg.eps_spread * actor_index / (n_actors - 1) if n_actors > 1 else 0.0
    final = cfg.eps_final ** (1.0 + spread)
    frac = min(1.0, global_steps / cfg.exploration_steps) if cfg.exploration_steps > 0 else 1.0
    return cfg.eps_start + frac * (final - cfg.eps_start)


def explore(actions: np.ndarray, epsilons, n_actions: int, rng: np.random.Generator
            ) -> np.ndarray:
    """`actions` with row i replaced by a uniform random action with probability
    epsilons[i] (a scalar broadcasts)."""
    eps = np.broadcast_to(np.asarray(epsilons, dtype=np.float64), actions.shape)
    chosen = rng.random(actions.shape) < eps
    actions[chosen] = rng.integers(0, n_actions, size=int(chosen.sum()))
    return actions


def mlp_q_layers(obs_dim: int, hidden: Sequence[int], n_actions: int, dueling: bool
                 ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(out, in) of each linear layer of an MLP `QNetwork`, trunk then heads (the value
    head, then the advantage head, when dueling), in the order of its parameters."""
    trunk, width = [], obs_dim
    for h in hidden:
        trunk.append((h, width))
        width = h
    heads = [(1, width), (n_actions, width)] if dueling else [(n_actions, width)]
    return trunk, heads


class MLPQValues:
    """The Q-values of an MLP `QNetwork` (ReLU trunk; a plain or dueling head) from its
    parameters as one flat float32 vector, laid out as the network's `parameters()`
    (each layer's weight (out, in) row-major, then its bias)."""

    def __init__(self, obs_dim: int, hidden: Sequence[int], n_actions: int, dueling: bool):
        self.dueling = bool(dueling)
        trunk, heads = mlp_q_layers(obs_dim, hidden, n_actions, dueling)
        self.flat = np.zeros(sum(o * i + o for o, i in trunk + heads), np.float32)
        views, offset = [], 0
        for out, inp in trunk + heads:
            w = self.flat[offset:offset + out * inp].reshape(out, inp)
            b = self.flat[offset + out * inp:offset + out * inp + out]
            views.append((w.T, b))          # z @ w.T: no copy, a transposed view
            offset += out * inp + out
        self._trunk, self._heads = views[:len(trunk)], views[len(trunk):]

    def load(self, flat: np.ndarray) -> None:
        flat = np.asarray(flat, dtype=np.float32).reshape(-1)
        if flat.size != self.flat.size:
            raise ValueError(f"vector has {flat.size} entries, expected {self.flat.size}")
        self.flat[:] = flat                # a copy: never alias the caller's memory

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        z = np.asarray(obs, np.float32).reshape(len(obs), -1)
        for wt, b in self._trunk:
            z = z @ wt
            z += b
            np.maximum(z, 0.0, out=z)
        outs = [z @ wt + b for wt, b in self._heads]
        if not self.dueling:
            return outs[0]
        value, adv = outs
        return value + adv - adv.mean(axis=1, keepdims=True)


class MLPQPolicy(Policy):
    """An actor's epsilon-greedy policy over an MLP Q-network in numpy, with this
    actor's epsilon (`actor_epsilon`)."""

    def __init__(self, obs_space, n_actions: int, cfg, actor_index: int, n_actors: int):
        self.cfg, self.n_actions = cfg, int(n_actions)
        self.actor_index, self.n_actors = actor_index, n_actors
        self.q = MLPQValues(math.prod(obs_space.shape), tuple(cfg.hidden), self.n_actions,
                            cfg.dueling)

    @property
    def num_params(self) -> int:
        return self.q.flat.size

    def set_flat_params(self, flat: np.ndarray) -> None:
        self.q.load(flat)

    def act(self, obs, rng, global_steps, deterministic=False):
        eps = 0.0 if deterministic else actor_epsilon(self.cfg, self.actor_index,
                                                      self.n_actors, global_steps)
        return explore(self.q(obs).argmax(axis=1).astype(np.int64), eps, self.n_actions, rng)


__all__ = ["MLPQPolicy", "MLPQValues", "actor_epsilon", "explore", "mlp_q_layers"]
