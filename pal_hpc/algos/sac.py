"""SAC (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications") with
twin critics, Polyak targets and an automatic entropy temperature, on the algorithm
contract (`pal_hpc.algos.base`).  Box action spaces in [-1, 1] (the runtime rescales).

Two update phases, every update: "critic" (both Q-networks, one flat buffer; returns
the new priorities) then "actor" (the policy *and* log_alpha in one flat buffer, so
one Allreduce serves both).  The reparameterisation noise the learner draws comes from
its own torch.Generator (seeded, checkpointed): runs are reproducible and no global
RNG is touched.  Actors run `acting.SquashedGaussianPolicy` (numpy): uniform actions
for the first `random_steps` global steps, then samples of the squashed Gaussian drawn
with the actor's numpy rng.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pal_hpc.algos.acting import LOG_STD_MAX, LOG_STD_MIN
from pal_hpc.algos.base import Algorithm
from pal_hpc.algos.configs import SACConfig, SACSpec
from pal_hpc.algos.nets import MLP, FlatParams, autocast, obs_dim, seeded
from pal_hpc.algos.optim import FlatAdam

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)
PHASES = ("critic", "actor")


# ---- the squashed Gaussian ------------------------------------------------------------------

def squashed_gaussian(mean: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The reparameterised sample a = tanh(mean + exp(log_std) * noise) and its log-density
    (B,): the Gaussian's minus the tanh correction log(1 - tanh(u)^2), written in the
    stable form 2 * (log 2 - u - softplus(-2u)) that stays finite for large |u|."""
    u = mean + log_std.exp() * noise
    gauss = (-0.5 * noise.pow(2) - log_std - _HALF_LOG_2PI).sum(-1)
    correction = (2.0 * (_LOG_2 - u - F.softplus(-2.0 * u))).sum(-1)
    return torch.tanh(u), gauss - correction


class GaussianActor(nn.Module):
    """MLP from a flattened observation to the mean and the clamped log-std of the
    pre-tanh Gaussian (one last layer for both: the same maths as two heads)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int]):
        super().__init__()
        self.act_dim = act_dim
        self.net = MLP([obs_dim, *hidden, 2 * act_dim])

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # float(): under bf16 autocast the sampling and log-density maths stay float32.
        mean, log_std = self.net(obs.reshape(obs.shape[0], -1)).float().chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Action in [-1, 1] (B, act_dim) and its log-probability (B,) for `noise` ~ N(0, I)."""
        return squashed_gaussian(*self(obs), noise)


class TwinQ(nn.Module):
    """Two independent Q-networks on concat(observation, action)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int]):
        super().__init__()
        self.q1 = MLP([obs_dim + act_dim, *hidden, 1])
        self.q2 = MLP([obs_dim + act_dim, *hidden, 1])

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs.reshape(obs.shape[0], -1), action], dim=1)
        return self.q1(x).float().squeeze(1), self.q2(x).float().squeeze(1)


class Temperature(nn.Module):
    """The entropy temperature, learnt as log_alpha (a module so FlatParams can hold it
    beside the actor's parameters)."""

    def __init__(self, init_alpha: float):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(math.log(init_alpha), dtype=torch.float32))


# ---- learning (acting: `pal_hpc.algos.acting.SquashedGaussianPolicy`) -----------------

class SAC(SACSpec, Algorithm):
    """Actor, twin critics with Polyak targets, and a learnt temperature; one FlatAdam
    per phase.  The batch's `reward` is the n-step return and its `discount` gamma**k
    (0 after a terminal): the actors built them."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, config: SACConfig | None = None,
                 *, device: str | torch.device = "cpu", seed: int = 0):
        config = config or SACConfig()
        super().__init__(obs_space, act_space, config, device=device, seed=seed)
        self.device = torch.device(device)
        self.obs_dim = obs_dim(obs_space)
        self.act_dim = math.prod(act_space.shape)
        self.tau, self.grad_clip = config.tau, config.grad_clip
        self.target_entropy = (float(config.target_entropy) if config.target_entropy is not None
                               else -float(self.act_dim))
        hidden = tuple(config.hidden)

        def build():
            return (GaussianActor(self.obs_dim, self.act_dim, hidden),
                    TwinQ(self.obs_dim, self.act_dim, hidden))

        actor, critic = seeded(seed, build)
        self.actor = actor.to(self.device)
        self.critic = critic.to(self.device)
        self.critic_target = copy.deepcopy(self.critic)
        self.temperature = Temperature(config.init_alpha).to(self.device)

        # One flat vector (and gradient) per phase: the Allreduce buffer.  The target's
        # flat vector makes the Polyak update one lerp over the whole critic.
        self._critic = FlatParams([self.critic], self.device)
        self._target = FlatParams([self.critic_target], self.device)
        self.critic_target.requires_grad_(False)
        self._actor = FlatParams([self.actor, self.temperature], self.device)
        self._n_actor = sum(p.numel() for p in self.actor.parameters())
        # Adam is elementwise: one FlatAdam over [actor, log_alpha] is an Adam for each.
        self.critic_optimizer = FlatAdam(self._critic.flat, lr=config.lr)
        self.actor_optimizer = FlatAdam(self._actor.flat, lr=config.lr)

        self.generator = torch.Generator(device=self.device)
        # A stream apart from the one that initialised the networks.
        self.generator.manual_seed(int(np.random.SeedSequence([seed, 0x5AC]).generate_state(1)[0]))
        self.updates = 0

    @property
    def alpha(self) -> float:
        """The current entropy temperature."""
        return float(self.temperature.log_alpha.detach().exp())

    # ---- acting (the spec's numpy policy: Algorithm.make_policy) ----------------------

    def policy_params(self) -> np.ndarray:
        return self._actor.flat[:self._n_actor].detach().cpu().numpy().astype(np.float32, copy=True)

    # ---- losses ---------------------------------------------------------------------

    def noise(self, b: int) -> torch.Tensor:
        """(b, act_dim) standard normal draws from the learner's own generator (this
        learner's rows of the global batch's draw: `Algorithm.set_rows`)."""
        return self.row_noise(b, self.act_dim, self.generator, self.device)

    @torch.no_grad()
    def critic_target_values(self, next_obs: torch.Tensor, reward: torch.Tensor,
                             discount: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """reward + discount * (min(Q1', Q2')(s', a') - alpha * log pi(a'|s')), a' ~ pi(s')
        with `noise` (B,)."""
        next_action, next_logp = self.actor.sample(next_obs, noise)
        q1, q2 = self.critic_target(next_obs, next_action)
        alpha = self.temperature.log_alpha.exp()
        return reward + discount * (torch.min(q1, q2) - alpha * next_logp)

    def critic_loss(self, batch: dict[str, np.ndarray], metrics: bool = True,
                    noise: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, dict[str, float], np.ndarray]:
        """Importance-weighted squared TD error of both critics, 0.5 * (d1^2 + d2^2) as
        SB3 and the paper (MSE: Huber would cap the gradient of Pendulum-sized returns,
        and the published SAC hyper-parameters are for MSE; the weights already damp
        the prioritized samples).  Returns (loss, metrics -- {} unless `metrics` --,
        priorities 0.5 * (|d1| + |d2|) float64 (B,): both critics learn on the sample)."""
        obs, next_obs = self._tensor(batch["obs"]), self._tensor(batch["next_obs"])
        action = self._tensor(batch["action"]).reshape(len(obs), self.act_dim)
        weights = self._tensor(batch["weights"])
        if noise is None:
            noise = self.noise(len(obs))
        target = self.critic_target_values(next_obs, self._tensor(batch["reward"]),
                                           self._tensor(batch["discount"]), noise)
        q1, q2 = self.critic(obs, action)
        d1, d2 = q1 - target, q2 - target
        loss = 0.5 * (weights * (d1.pow(2) + d2.pow(2))).mean()
        td_abs = 0.5 * (d1.detach().abs() + d2.detach().abs())
        stats: dict[str, float] = {}
        if metrics:
            q_mean = 0.5 * (q1.detach().mean() + q2.detach().mean())
            values = torch.stack([loss.detach(), q_mean, td_abs.mean()]).tolist()
            stats = dict(zip(("critic_loss", "q_mean", "td_abs_mean"), values))
        return loss, stats, td_abs.cpu().numpy().astype(np.float64)

    def actor_loss(self, batch: dict[str, np.ndarray], metrics: bool = True,
                   noise: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """mean(alpha * log pi(a|s) - min(Q1, Q2)(s, a)) plus the temperature loss
        -mean(log_alpha * (log pi + target_entropy).detach()), unweighted (as Tianshou:
        the importance weights correct the critics' regression targets).  The critic's
        parameters get no gradient here."""
        obs = self._tensor(batch["obs"])
        if noise is None:
            noise = self.noise(len(obs))
        action, logp = self.actor.sample(obs, noise)
        log_alpha = self.temperature.log_alpha
        alpha = log_alpha.detach().exp()
        self.critic.requires_grad_(False)
        try:
            q1, q2 = self.critic(obs, action)
        finally:
            self.critic.requires_grad_(True)
        policy_loss = (alpha * logp - torch.min(q1, q2)).mean()
        alpha_loss = -(log_alpha * (logp.detach() + self.target_entropy)).mean()
        stats: dict[str, float] = {}
        if metrics:
            values = torch.stack([policy_loss.detach(), alpha, -logp.detach().mean()]).tolist()
            stats = dict(zip(("actor_loss", "alpha", "entropy"), values))
        return policy_loss + alpha_loss, stats

    # ---- the contract's update phases --------------------------------------------------

    def phases(self, update: int) -> tuple[str, ...]:
        return PHASES

    def phase_size(self, phase: str) -> int:
        return self._flat_params(phase).numel

    def compute_gradients(self, phase: str, batch: dict[str, np.ndarray], out: np.ndarray,
                          metrics: bool = False) -> tuple[dict[str, float], np.ndarray | None]:
        """Backpropagate `phase`'s loss into `out` (float32, phase_size(phase)); return
        (metrics, priorities) -- priorities from "critic", None from "actor"."""
        params = self._flat_params(phase)
        if out is None or out.dtype != np.float32 or out.shape != (params.numel,):
            raise ValueError(f"out must be float32 of shape ({params.numel},), got "
                             f"{None if out is None else (out.dtype, out.shape)}")
        params.grad.zero_()
        with autocast(self.device, self.config.precision):
            if phase == "critic":
                loss, stats, priorities = self.critic_loss(batch, metrics)
            else:
                (loss, stats), priorities = self.actor_loss(batch, metrics), None
        loss.backward()
        out[...] = params.grad.cpu().numpy()
        return stats, priorities

    def apply_gradients(self, phase: str, flat_grad: np.ndarray, scale: float = 1.0) -> None:
        """Step `phase`'s Adam with `flat_grad * scale` (the critic's or actor's part
        clipped to `grad_clip` first, if > 0); after the critic, the Polyak update of
        its target."""
        params = self._flat_params(phase)
        flat = torch.as_tensor(np.asarray(flat_grad, dtype=np.float32), device=self.device)
        if flat.numel() != params.numel:
            raise ValueError(f"gradient has {flat.numel()} entries, expected {params.numel}")
        torch.mul(flat, scale, out=params.grad)
        if phase == "critic":
            _clip_(params.grad, self.grad_clip)
            self.critic_optimizer.step(params.grad)
            self._target.flat.lerp_(self._critic.flat, self.tau)
        else:
            # log_alpha's gradient is left out of the actor's norm.
            _clip_(params.grad[:self._n_actor], self.grad_clip)
            self.actor_optimizer.step(params.grad)
            self.updates += 1

    def _flat_params(self, phase: str) -> FlatParams:
        if phase == "critic":
            return self._critic
        if phase == "actor":
            return self._actor
        raise ValueError(f"sac's update phases are {PHASES}; got {phase!r}")

    # ---- state ------------------------------------------------------------------------

    def state_arrays(self) -> list[np.ndarray]:
        # Critic, target critic, then actor with log_alpha as its last entry.
        return [p.flat.detach().cpu().numpy().copy()
                for p in (self._critic, self._target, self._actor)]

    def state_dict(self) -> dict:
        """A snapshot (copies) of the networks, target, log_alpha, both optimizers, the
        noise generator and the update count."""
        return {"actor": _clone(self.actor.state_dict()),
                "critic": _clone(self.critic.state_dict()),
                "critic_target": _clone(self.critic_target.state_dict()),
                "log_alpha": self.temperature.log_alpha.detach().clone(),
                "critic_optimizer": _clone(self.critic_optimizer.state_dict()),
                "actor_optimizer": _clone(self.actor_optimizer.state_dict()),
                "generator": self.generator.get_state(),
                "updates": self.updates}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict() returned (in place: the flat buffers stay shared)."""
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        self.temperature.log_alpha.copy_(torch.as_tensor(state["log_alpha"]))
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.generator.set_state(torch.as_tensor(state["generator"], dtype=torch.uint8).cpu())
        self.updates = int(state["updates"])

    def _tensor(self, x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(x, dtype=torch.float32, device=self.device)


def _clip_(grad: torch.Tensor, max_norm: float) -> None:
    """Scale `grad` in place by min(1, max_norm / (||grad|| + 1e-6)) (clip_grad_norm_'s
    rule) when max_norm > 0."""
    if max_norm > 0:
        norm = torch.linalg.vector_norm(grad)
        grad.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))


def _clone(state: dict) -> dict:
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
