"""The actor side of the algorithm contract (`pal_hpc.algos.base`), without torch:
`Policy`, what an actor rank runs, and the policies of the off-policy algorithms'
MLP networks in numpy, read from the flat vector the learners publish.

An actor acts on a few observations a step, where torch's fixed cost per op is nearly
all of a small network's forward pass: 8 Blackjack observations through the reactor
paper's 3-32-2 network take 76 us through torch, a few through numpy (Zen 4, one
thread).  And an actor rank that is no learner starts without importing torch
(`AlgoSpec.numpy_policy`): 2.6 CPU-s and ~160 MB less a rank on a 2-core EPYC.  The
outputs agree with the torch networks' to float32 rounding (tests/test_dqn.py,
test_ddpg.py, test_sac.py); exploration draws from the actor's numpy generator, as
the torch policies did.  Atari's frames (the Nature and NIPS CNNs) act through torch
(`pal_hpc.algos.dqn.DQNPolicy`).

- DQN: `QPolicy`, epsilon-greedy with the actor's epsilon (`actor_epsilon`, an Ape-X
  spread of final epsilons) over a Q-network, plain or dueling: an MLP (`QValues`) or
  MinAtar's network (`MinAtarQValues`).
- DDPG, TD3: `DeterministicPolicy`, tanh(MLP) plus the actor's Gaussian noise
  (`actor_sigma`).
- SAC: `SquashedGaussianPolicy`, tanh of a sample of the MLP's Gaussian.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

# SAC's clamp of the log-std (`pal_hpc.algos.sac.GaussianActor`).
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


class Policy(ABC):
    """What an actor runs: `act` on a batch of observations, with exploration.

    Parameters come from the learners' published flat vector (`set_flat_params`);
    a policy never learns."""

    @property
    @abstractmethod
    def num_params(self) -> int:
        """Length of the flat vector `set_flat_params` takes."""

    @abstractmethod
    def set_flat_params(self, flat: np.ndarray) -> None:
        """Load the parameters the learners published (a copy; never aliased)."""

    @abstractmethod
    def act(self, obs: np.ndarray, rng: np.random.Generator, global_steps: float,
            deterministic: bool = False) -> np.ndarray:
        """Actions for a batch of observations (B, *obs_shape), in the env's action
        space (Discrete: int64 (B,); Box: float32 (B, act_dim) in [-1, 1], which the
        runtime's environments take).  `global_steps` (env steps of the whole job)
        drives exploration schedules; `deterministic` is the evaluation policy
        (greedy, or the mean action)."""

    @staticmethod
    def uniform(rng: np.random.Generator, b: int, act_dim: int) -> np.ndarray:
        """b uniform random actions in [-1, 1] (continuous exploration before learning)."""
        return rng.uniform(-1.0, 1.0, size=(b, act_dim)).astype(np.float32)


# ---- exploration schedules ---------------------------------------------------------------

def actor_epsilon(cfg, actor_index: int, n_actors: int, global_steps: float) -> float:
    """DQN: linear decay from eps_start to this actor's final epsilon over
    exploration_steps; final epsilons spread Ape-X style:
    eps_final ** (1 + eps_spread * i / (N - 1))."""
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


def actor_sigma(cfg, actor_index: int, n_actors: int) -> float:
    """DDPG/TD3: exploration std of actor i of N, action_noise * (1 + noise_spread * i /
    (N-1)).  Linear rather than Ape-X's geometric epsilons: those span orders of
    magnitude, this spans a factor 1 + noise_spread (2 by default), where the two
    differ little."""
    spread = cfg.noise_spread * actor_index / (n_actors - 1) if n_actors > 1 else 0.0
    return cfg.action_noise * (1.0 + spread)


# ---- networks from a flat vector -------------------------------------------------------------

class FlatLayers:
    """Linear layers whose parameters are views of one flat float32 vector, laid out as
    torch's `parameters()` of the same layers: each weight (out, in) row-major, then
    its bias.  `sizes` lists each layer's (out, in)."""

    def __init__(self, sizes: Sequence[tuple[int, int]]):
        self.flat = np.zeros(sum(o * i + o for o, i in sizes), np.float32)
        self.layers, offset = [], 0
        for out, inp in sizes:
            w = self.flat[offset:offset + out * inp].reshape(out, inp)
            b = self.flat[offset + out * inp:offset + out * inp + out]
            self.layers.append((w.T, b))        # z @ w.T: a transposed view, no copy
            offset += out * inp + out

    def load(self, flat: np.ndarray) -> None:
        flat = np.asarray(flat, dtype=np.float32).reshape(-1)
        if flat.size != self.flat.size:
            raise ValueError(f"vector has {flat.size} entries, expected {self.flat.size}")
        self.flat[:] = flat                     # a copy: never alias the caller's memory

    @staticmethod
    def relu_stack(z: np.ndarray, layers) -> np.ndarray:
        """`layers` in turn, each followed by ReLU."""
        for wt, b in layers:
            z = z @ wt
            z += b
            np.maximum(z, 0.0, out=z)
        return z

    def mlp(self, obs: np.ndarray) -> np.ndarray:
        """All layers, ReLU between them and none after the last (`nets.MLP`), on the
        flattened float32 observations."""
        z = self.relu_stack(np.asarray(obs, np.float32).reshape(len(obs), -1),
                            self.layers[:-1])
        wt, b = self.layers[-1]
        return z @ wt + b


def mlp_sizes(widths: Sequence[int]) -> list[tuple[int, int]]:
    """(out, in) of the layers of an MLP through `widths` (input first)."""
    return [(b, a) for a, b in zip(widths[:-1], widths[1:])]


class QValues(FlatLayers):
    """The Q-values of a `QNetwork` with an MLP trunk (ReLU after each layer) on vector
    observations, and a plain head or a dueling one (the value head, then the advantage
    head, combined as V + A - mean(A))."""

    def __init__(self, obs_dim: int, hidden: Sequence[int], n_actions: int, dueling: bool,
                 first: Sequence[tuple[int, int]] = ()):
        # `first`: layers before the trunk's (MinAtarQValues' convolution).
        trunk = [*first, *mlp_sizes([obs_dim, *hidden])]
        width = ([obs_dim, *hidden])[-1]
        heads = [(1, width), (n_actions, width)] if dueling else [(n_actions, width)]
        super().__init__(trunk + heads)
        self.dueling = bool(dueling)
        self._trunk = self.layers[len(first):len(trunk)]
        self._heads = self.layers[len(trunk):]

    def features(self, obs: np.ndarray) -> np.ndarray:
        """The observations as the trunk's first layer takes them."""
        return np.asarray(obs, np.float32).reshape(len(obs), -1)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        z = self.relu_stack(self.features(obs), self._trunk)
        outs = [z @ wt + b for wt, b in self._heads]
        if not self.dueling:
            return outs[0]
        value, adv = outs
        return value + adv - adv.mean(axis=1, keepdims=True)


class MinAtarQValues(QValues):
    """The Q-values of a `QNetwork` on MinAtar's network (`cnn` "minatar": one unpadded
    k x k convolution with stride s and ReLU, a dense layer and ReLU, the heads), on
    uint8 (C, H, W) frames scaled by 1/255 as the CNN torso does.  The convolution runs
    in C from the uint8 frames (`pal_hpc.algos._convcore`, as the numpy TD gradient's,
    `dqn_numpy`); its output is in the order torch's Flatten gives the dense layer."""

    def __init__(self, frame_shape: Sequence[int], filters: int, kernel: int, stride: int,
                 dense: int, n_actions: int, dueling: bool):
        c, h, w = (int(x) for x in frame_shape)
        oh, ow = (h - kernel) // stride + 1, (w - kernel) // stride + 1
        self.frame_shape, self.k, self.s = (c, h, w), kernel, stride
        self.out_shape = (filters, oh * ow)
        super().__init__(filters * oh * ow, [dense], n_actions, dueling,
                         first=[(filters, c * kernel * kernel)])
        self._wt = np.zeros((c * kernel * kernel, filters), np.float32)

    def load(self, flat: np.ndarray) -> None:
        super().load(flat)
        # conv_relu takes the weight as (C*k*k, filters), C-contiguous.
        self._wt[:] = self.layers[0][0]

    def features(self, obs: np.ndarray) -> np.ndarray:
        from pal_hpc.algos._convcore import conv_relu

        x = np.asarray(obs)
        if x.dtype == np.bool_:
            x = x.view(np.uint8)
        frames = np.ascontiguousarray(x, dtype=np.uint8).reshape(len(x), *self.frame_shape)
        h = np.empty((len(frames), *self.out_shape), np.float32)
        conv_relu(frames, self._wt, self.layers[0][1], self.k, self.s, h)
        return h.reshape(len(h), -1)


# ---- the policies ------------------------------------------------------------------------------

class _FlatPolicy(Policy):
    """A policy over one `FlatLayers` network, `self.net`."""

    net: FlatLayers

    @property
    def num_params(self) -> int:
        return self.net.flat.size

    def set_flat_params(self, flat: np.ndarray) -> None:
        self.net.load(flat)


class QPolicy(_FlatPolicy):
    """DQN's actor: epsilon-greedy over a Q-network in numpy (`QValues` on vectors,
    `MinAtarQValues` on MinAtar's frames), with this actor's epsilon (`actor_epsilon`)."""

    def __init__(self, q: QValues, cfg, actor_index: int, n_actors: int):
        self.cfg, self.n_actions = cfg, q.layers[-1][1].size
        self.actor_index, self.n_actors = actor_index, n_actors
        self.net = self.q = q

    def act(self, obs, rng, global_steps, deterministic=False):
        eps = 0.0 if deterministic else actor_epsilon(self.cfg, self.actor_index,
                                                      self.n_actors, global_steps)
        return explore(self.q(obs).argmax(axis=1).astype(np.int64), eps, self.n_actions, rng)


class DeterministicPolicy(_FlatPolicy):
    """DDPG's and TD3's actor: the mean action tanh(MLP(obs)) when deterministic; else
    uniform in [-1, 1] before `random_steps` global steps, then the mean plus
    N(0, sigma) noise, clipped to [-1, 1]."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int], sigma: float,
                 random_steps: int):
        self.act_dim, self.sigma, self.random_steps = act_dim, sigma, random_steps
        self.net = FlatLayers(mlp_sizes([obs_dim, *hidden, act_dim]))

    def act(self, obs, rng, global_steps, deterministic=False):
        b = len(obs)
        if not deterministic and global_steps < self.random_steps:
            return self.uniform(rng, b, self.act_dim)
        mean = np.tanh(self.net.mlp(obs))
        if deterministic or self.sigma == 0:
            return mean.astype(np.float32, copy=False)
        noisy = mean + self.sigma * rng.standard_normal(mean.shape)
        return np.clip(noisy, -1.0, 1.0).astype(np.float32)


class SquashedGaussianPolicy(_FlatPolicy):
    """SAC's actor: uniform random actions while global_steps < random_steps, then
    tanh(mean + exp(log_std) * noise) with the noise from the actor's numpy generator;
    tanh(mean) when deterministic.  The MLP's last layer gives the mean and the
    (clamped) log-std side by side."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int], random_steps: int):
        self.act_dim, self.random_steps = act_dim, random_steps
        self.net = FlatLayers(mlp_sizes([obs_dim, *hidden, 2 * act_dim]))

    def act(self, obs, rng, global_steps, deterministic=False):
        b, act_dim = len(obs), self.act_dim
        if not deterministic and global_steps < self.random_steps:
            return self.uniform(rng, b, act_dim)
        out = self.net.mlp(obs)
        mean = out[:, :act_dim]
        if deterministic:
            return np.tanh(mean)
        log_std = np.clip(out[:, act_dim:], LOG_STD_MIN, LOG_STD_MAX)
        noise = rng.standard_normal((b, act_dim)).astype(np.float32)
        return np.tanh(mean + np.exp(log_std) * noise)


__all__ = ["DeterministicPolicy", "FlatLayers", "LOG_STD_MAX", "LOG_STD_MIN",
           "MinAtarQValues", "Policy", "QPolicy", "QValues", "SquashedGaussianPolicy",
           "actor_epsilon", "actor_sigma", "explore", "mlp_sizes"]
