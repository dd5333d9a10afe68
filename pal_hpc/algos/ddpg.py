"""DDPG (Lillicrap et al. 2016) on the algorithm contract (`pal_hpc.algos.base`), and the
base TD3 builds on (`pal_hpc.algos.td3`).

Box action spaces only: the runtime rescales every Box env's actions to [-1, 1], so the
deterministic actor ends in tanh.  Two update phases, each with its own flat parameter
buffer and Adam:

    "critic"  importance-weighted squared TD error of every critic against
              reward + discount * min_j Q'_j(s', a'), a' = target actor(s');
              returns the new priorities |TD| (mean over critics)
    "actor"   -Q1(s, actor(s)) with the critic as it stands after its own step; then
              Polyak averaging of the actor and critic targets

DDPG runs both phases on every update; TD3 overrides `phases` (delayed actor),
`n_critics` (twin critics) and `target_action` (target policy smoothing).

Actors run `acting.DeterministicPolicy` (numpy): uniform random actions until
`random_steps` global env steps, then the deterministic action plus Gaussian noise
whose std grows linearly across actors (Ape-X style spread).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import ClassVar

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pal_hpc.algos.base import Algorithm
from pal_hpc.algos.configs import DDPGConfig, DDPGSpec
from pal_hpc.algos.nets import MLP, FlatParams, autocast, obs_dim, seeded
from pal_hpc.algos.optim import FlatAdam

# The arrays a loss batch carries.
BATCH_KEYS = ("obs", "action", "reward", "next_obs", "discount", "weights")
PHASES = ("critic", "actor")

class Actor(nn.Module):
    """Deterministic policy: MLP from a flattened observation to tanh actions in [-1, 1]."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int]):
        super().__init__()
        self.mlp = MLP([obs_dim, *hidden, act_dim])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions (B, act_dim) for observations (B, *obs_shape)."""
        return torch.tanh(self.mlp(obs.reshape(obs.shape[0], -1)))


class Critic(nn.Module):
    """Q(s, a): MLP on concat(flattened observation, action) to one value."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int]):
        super().__init__()
        self.mlp = MLP([obs_dim + act_dim, *hidden, 1])

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Q-values (B,)."""
        b = obs.shape[0]
        return self.mlp(torch.cat([obs.reshape(b, -1), action.reshape(b, -1)], dim=1)).squeeze(1)


class DDPG(DDPGSpec, Algorithm):
    """Actor, critic(s), their targets and one Adam per phase, on flat buffers.

    The batch's `reward` is already the n-step discounted return and its `discount`
    is gamma**k for the bootstrap (0 after a terminal): the actors built them."""

    n_critics: ClassVar[int] = 1

    def __init__(self, obs_space: gym.Space, act_space: gym.Space,
                 config: DDPGConfig | None = None, *, device: str | torch.device = "cpu",
                 seed: int = 0):
        config = config or self.Config()
        super().__init__(obs_space, act_space, config, device=device, seed=seed)
        self.device = torch.device(device)
        self.act_dim = math.prod(act_space.shape)
        self.actor, self.critics = seeded(seed, self._networks)
        self.actor.to(self.device)
        self.critics.to(self.device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critics).requires_grad_(False)
        # Each phase's parameters (and their .grad) are views of one flat vector: the
        # gradient leaves for the Allreduce without a gather and is stepped by one
        # fused Adam.  The targets are flat too, so Polyak is one lerp per vector.
        self._actor_params = FlatParams([self.actor], self.device)
        self._critic_params = FlatParams([self.critics], self.device)
        self._actor_target_flat = FlatParams([self.actor_target], self.device).flat
        self._critic_target_flat = FlatParams([self.critic_target], self.device).flat
        self.actor_optimizer = FlatAdam(self._actor_params.flat, lr=config.actor_lr)
        self.critic_optimizer = FlatAdam(self._critic_params.flat, lr=config.critic_lr)
        self.updates = 0         # critic steps taken (= updates completed or under way)
        self.actor_updates = 0   # actor steps taken (each followed by a target update)

    def _networks(self) -> tuple[Actor, nn.ModuleList]:
        hidden, d = tuple(self.config.hidden), obs_dim(self.obs_space)
        actor = Actor(d, self.act_dim, hidden)
        critics = nn.ModuleList(Critic(d, self.act_dim, hidden) for _ in range(self.n_critics))
        return actor, critics

    # ---- acting (the spec's numpy policy: Algorithm.make_policy) ------------------------

    def policy_params(self) -> np.ndarray:
        return self._numpy(self._actor_params.flat)

    # ---- learning ---------------------------------------------------------------------

    def phases(self, update: int) -> tuple[str, ...]:
        return PHASES

    def phase_size(self, phase: str) -> int:
        return self._phase(phase)[0].numel

    def target_action(self, next_obs: torch.Tensor) -> torch.Tensor:
        """The action the bootstrap values: the target actor's (TD3 adds smoothing)."""
        return self.actor_target(next_obs)

    def critic_loss(self, batch: dict[str, np.ndarray], metrics: bool = True
                    ) -> tuple[torch.Tensor, dict[str, float], np.ndarray]:
        """Sum over critics of mean(weights * TD^2), TD = reward + discount *
        min_j Q'_j(s', a') - Q_i(s, a).

        Squared error, not Huber: the loss of the DDPG/TD3 papers and of PER's
        weighted update (weights * TD * grad Q); Pendulum-scale rewards are bounded,
        and `grad_clip` is the knob for outliers.  Returns (loss, metrics
        {"critic_loss", "q_mean", "td_abs_mean"} -- {} unless `metrics` --, new
        priorities: |TD| averaged over the critics, float64 (B,))."""
        obs, next_obs = self._tensor(batch["obs"]), self._tensor(batch["next_obs"])
        action = self._tensor(batch["action"]).reshape(obs.shape[0], self.act_dim)
        reward, discount = self._tensor(batch["reward"]), self._tensor(batch["discount"])
        weights = self._tensor(batch["weights"])
        with autocast(self.device, self.config.precision):
            with torch.no_grad():
                next_action = self.target_action(next_obs)
                next_q = torch.stack([q(next_obs, next_action) for q in self.critic_target])
            q = torch.stack([critic(obs, action) for critic in self.critics])  # (n_critics, B)
        # The TD error and the loss in float32 whatever the networks' precision.
        q = q.float()
        target = reward + discount * next_q.float().min(dim=0).values
        td = target - q
        loss = (weights * td.square()).mean(dim=1).sum()
        td_abs = td.detach().abs().mean(dim=0)
        stats: dict[str, float] = {}
        if metrics:
            # One device->host transfer for the three numbers (one sync on a GPU).
            values = torch.stack([loss.detach(), q.detach().mean(), td_abs.mean()]).tolist()
            stats = dict(zip(("critic_loss", "q_mean", "td_abs_mean"), values))
        return loss, stats, td_abs.cpu().numpy().astype(np.float64)

    def actor_loss(self, batch: dict[str, np.ndarray]) -> torch.Tensor:
        """-mean Q1(s, actor(s)) with the critic's current parameters.  Unweighted, as
        in PER-TD3 practice: the importance weights correct the critic's regression
        towards the sampling distribution; the actor just ascends Q on visited states."""
        obs = self._tensor(batch["obs"])
        with autocast(self.device, self.config.precision):
            q = self.critics[0](obs, self.actor(obs))
        return -q.float().mean()

    def compute_gradients(self, phase: str, batch: dict[str, np.ndarray],
                          out: np.ndarray | None = None, metrics: bool = False
                          ) -> tuple[dict[str, float], np.ndarray | None]:
        """Backpropagate `phase`'s loss into `out` (float32, phase_size(phase)); return
        (metrics, priorities) -- priorities from the critic phase only."""
        params, _ = self._phase(phase)
        if out is None or out.dtype != np.float32 or out.shape != (params.numel,):
            raise ValueError(f"out must be float32 of shape ({params.numel},), got "
                             f"{None if out is None else (out.dtype, out.shape)}")
        params.grad.zero_()
        if phase == "critic":
            # Only the critics' parameters take part (the target is computed without
            # grad), so the backward touches no other buffer.
            loss, stats, priorities = self.critic_loss(batch, metrics)
            loss.backward()
        else:
            loss = self.actor_loss(batch)
            # `inputs=` keeps the critic's .grad views untouched by the actor's loss.
            loss.backward(inputs=params.params)
            stats, priorities = ({"actor_loss": loss.item()} if metrics else {}), None
        out[...] = params.grad.cpu().numpy()
        return stats, priorities

    def apply_gradients(self, phase: str, flat_grad: np.ndarray, scale: float = 1.0) -> None:
        """Step `phase`'s Adam with `flat_grad * scale` (clipped to `grad_clip` if > 0);
        after an actor step, Polyak-average both targets towards the online nets."""
        params, optimizer = self._phase(phase)
        flat = torch.as_tensor(np.asarray(flat_grad, dtype=np.float32), device=self.device)
        if flat.numel() != params.numel:
            raise ValueError(f"{phase} gradient has {flat.numel()} entries, expected "
                             f"{params.numel}")
        torch.mul(flat, scale, out=params.grad)
        optimizer.step(params.grad, clip_norm=self.config.grad_clip)
        if phase == "critic":
            self.updates += 1
        else:
            self.actor_updates += 1
            self.update_targets()

    @torch.no_grad()
    def update_targets(self) -> None:
        """target <- (1 - tau) * target + tau * online, for actor and critics."""
        tau = self.config.tau
        self._actor_target_flat.lerp_(self._actor_params.flat, tau)
        self._critic_target_flat.lerp_(self._critic_params.flat, tau)

    def _phase(self, phase: str) -> tuple[FlatParams, FlatAdam]:
        if phase == "critic":
            return self._critic_params, self.critic_optimizer
        if phase == "actor":
            return self._actor_params, self.actor_optimizer
        raise ValueError(f"{self.name} has update phases {PHASES}; got {phase!r}")

    # ---- state ------------------------------------------------------------------------

    def state_arrays(self) -> list[np.ndarray]:
        return [self._numpy(t) for t in (self._actor_params.flat, self._critic_params.flat,
                                         self._actor_target_flat, self._critic_target_flat)]

    def state_dict(self) -> dict:
        """Networks, targets, optimizers and update counts -- copies, so later updates
        leave a saved state alone."""
        state = {"actor": self.actor.state_dict(), "critic": self.critics.state_dict(),
                 "actor_target": self.actor_target.state_dict(),
                 "critic_target": self.critic_target.state_dict(),
                 "actor_optimizer": self.actor_optimizer.state_dict(),
                 "critic_optimizer": self.critic_optimizer.state_dict(),
                 "updates": self.updates, "actor_updates": self.actor_updates}
        return _clone(state)

    def load_state_dict(self, state: dict) -> None:
        # Module.load_state_dict copies into the existing parameters: the flat views
        # survive.
        self.actor.load_state_dict(state["actor"])
        self.critics.load_state_dict(state["critic"])
        self.actor_target.load_state_dict(state["actor_target"])
        self.critic_target.load_state_dict(state["critic_target"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.updates, self.actor_updates = int(state["updates"]), int(state["actor_updates"])

    def _tensor(self, x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(x, dtype=torch.float32, device=self.device)

    @staticmethod
    def _numpy(t: torch.Tensor) -> np.ndarray:
        return t.detach().cpu().numpy().astype(np.float32, copy=True)


def _clone(tree):
    """A copy of a nested dict whose tensors are cloned (numbers pass through)."""
    if isinstance(tree, dict):
        return {k: _clone(v) for k, v in tree.items()}
    if isinstance(tree, torch.Tensor):
        return tree.detach().clone()
    return tree
