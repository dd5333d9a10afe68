"""Prioritized experience replay for Stable-Baselines3 on pal_hpc's K-ary sum tree.

    from pal_hpc.integrations.sb3 import DQN
    model = DQN("MlpPolicy", "CartPole-v1", replay_buffer_kwargs=dict(alpha=0.6, beta=0.4))
    model.learn(50_000)

`PrioritizedReplayBuffer` keeps SB3's `ReplayBuffer` storage and API (`add`, `sample`,
`n_envs`, `handle_timeout_termination`) and draws rows in proportion to p ** alpha;
`sample` returns SB3's `ReplayBufferSamples` with two more attributes, `weights`
(importance weights, shape (batch, 1)) and `indices` (flat row numbers for
`update_priorities`).  `DQN`, `SAC` and `TD3` are SB3's, with `train` weighting the TD
loss by those weights, setting each sampled row's priority to |TD error| (+ eps) after
every gradient step, and annealing beta linearly to 1 over `learn`'s total steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
import torch.nn.functional as F
from gymnasium import spaces
from stable_baselines3 import DQN as _DQN
from stable_baselines3 import SAC as _SAC
from stable_baselines3 import TD3 as _TD3
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.type_aliases import ReplayBufferSamples
from stable_baselines3.common.utils import polyak_update

from pal_hpc.integrations.per import ProportionalPriorities, check_exponent

__all__ = ["DQN", "SAC", "TD3", "PrioritizedReplayBuffer", "PrioritizedReplayBufferSamples"]


class PrioritizedReplayBufferSamples(ReplayBufferSamples):
    """SB3's `ReplayBufferSamples` (same fields, same tuple) plus `weights`, the
    importance weights as a (batch, 1) float tensor, and `indices`, the sampled flat
    row numbers (int64 numpy array) to pass back to `update_priorities`."""

    weights: th.Tensor
    indices: np.ndarray

    def __new__(cls, *fields, weights: th.Tensor, indices: np.ndarray):
        self = super().__new__(cls, *fields)
        self.weights = weights
        self.indices = indices
        return self


class PrioritizedReplayBuffer(ReplayBuffer):
    """SB3's `ReplayBuffer` whose `sample` draws rows in proportion to p ** alpha.

    Row r of env e is flat row `r * n_envs + e`.  A new row gets the largest priority
    set so far (1 at first), so it is drawn soon.  `alpha`, `beta` (the importance
    exponent until an algorithm anneals it), `eps` (added to every |TD error|) and
    `fanout` (of the tree) come through SB3's `replay_buffer_kwargs`.
    `optimize_memory_usage` is refused; `handle_timeout_termination` works as in SB3.
    """

    def __init__(self, buffer_size: int, observation_space: spaces.Space,
                 action_space: spaces.Space, device: th.device | str = "auto",
                 n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, *, alpha: float = 0.6,
                 beta: float = 0.4, eps: float = 1e-6, fanout: int = 16):
        if optimize_memory_usage:
            raise ValueError("PrioritizedReplayBuffer does not support optimize_memory_usage=True "
                             "(a row's next observation would be the next row, which a "
                             "priority update cannot follow); pass optimize_memory_usage=False")
        if isinstance(observation_space, spaces.Dict):
            raise TypeError("PrioritizedReplayBuffer stores array observations; Dict "
                            "observation spaces (DictReplayBuffer) are not supported")
        for name, value in (("buffer_size", buffer_size), ("n_envs", n_envs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        # The tree first: a capacity it refuses fails before SB3 allocates its arrays.
        rows = max(buffer_size // n_envs, 1)
        self._per = ProportionalPriorities(rows * n_envs, alpha, eps, fanout)
        super().__init__(buffer_size, observation_space, action_space, device, n_envs=n_envs,
                         optimize_memory_usage=False,
                         handle_timeout_termination=handle_timeout_termination)
        self.beta_start = self.beta = check_exponent("beta", beta)
        self.max_priority = 1.0

    @property
    def alpha(self) -> float:
        """The priority exponent."""
        return self._per.alpha

    @property
    def eps(self) -> float:
        """Added to every |TD error| so that no stored row has priority zero."""
        return self._per.eps

    def anneal_beta(self, progress: float) -> None:
        """Set beta for training `progress` in [0, 1]: beta_start at 0, 1 at 1."""
        progress = min(max(float(progress), 0.0), 1.0)
        self.beta = self.beta_start + (1.0 - self.beta_start) * progress

    def add(self, obs, next_obs, action, reward, done, infos: list[dict[str, Any]]) -> None:
        """SB3's `add`; the new rows get the largest priority seen so far."""
        row = self.pos
        super().add(obs, next_obs, action, reward, done, infos)
        first = row * self.n_envs
        self._per.set(np.arange(first, first + self.n_envs), self.max_priority - self.eps)

    def sample(self, batch_size: int, env=None) -> PrioritizedReplayBufferSamples:
        """`batch_size` rows drawn in proportion to p ** alpha (stratified, as in the
        PER paper) with their importance weights for the current beta."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        flat, weights = self._per.sample(np.random.random(batch_size), self.beta, True)
        rows, envs = np.divmod(flat, self.n_envs)
        data = (
            self._normalize_obs(self.observations[rows, envs, :], env),
            self.actions[rows, envs, :],
            self._normalize_obs(self.next_observations[rows, envs, :], env),
            # As SB3: a time-limit truncation is not a terminal state.
            (self.dones[rows, envs] * (1 - self.timeouts[rows, envs])).reshape(-1, 1),
            self._normalize_reward(self.rewards[rows, envs].reshape(-1, 1), env),
        )
        return PrioritizedReplayBufferSamples(*map(self.to_torch, data),
                                              weights=self.to_torch(weights.reshape(-1, 1)),
                                              indices=flat)

    def update_priorities(self, indices, td_errors) -> None:
        """Set the priority of flat rows `indices` to |td_errors| + eps.

        Raises IndexError for a row that is not stored and ValueError for a NaN or
        infinite error, in both cases before changing anything."""
        if isinstance(td_errors, th.Tensor):
            td_errors = td_errors.detach().cpu().numpy()
        if isinstance(indices, th.Tensor):
            indices = indices.cpu().numpy()
        idx = np.asarray(indices).reshape(-1)
        err = np.asarray(td_errors, dtype=np.float64).reshape(-1)
        if idx.shape != err.shape:
            raise ValueError(f"td_errors has {err.size} values for {idx.size} indices")
        stored = self.size() * self.n_envs
        if idx.dtype.kind in "iu" and idx.size and (idx.min() < 0 or idx.max() >= stored):
            bad = int(np.flatnonzero((idx < 0) | (idx >= stored))[0])
            raise IndexError(f"indices[{bad}] = {idx[bad]} is not a stored row "
                             f"(the buffer holds rows [0, {stored}))")
        raw = self._per.set(idx, np.abs(err))
        if raw.size:
            self.max_priority = max(self.max_priority, float(raw.max()) + self.eps)

    def priorities(self) -> np.ndarray:
        """Current priorities p = |TD error| + eps of the stored rows, in storage
        order (flat row r * n_envs + e)."""
        return self._per.p[: self.size() * self.n_envs].copy()

    def reset(self) -> None:
        """Empty the buffer, priorities included."""
        super().reset()
        if hasattr(self, "_per"):
            self._per.clear()
            self.max_priority = 1.0


class _Prioritized:
    """What the three algorithms share: PrioritizedReplayBuffer by default, beta
    annealed over `learn`, and the priority update after a gradient step."""

    def _setup_model(self) -> None:
        if self.replay_buffer_class is None:
            self.replay_buffer_class = PrioritizedReplayBuffer
        if not issubclass(self.replay_buffer_class, PrioritizedReplayBuffer):
            raise TypeError(f"{type(self).__name__} needs a PrioritizedReplayBuffer, got "
                            f"replay_buffer_class={self.replay_buffer_class.__name__}")
        if self.n_steps != 1:
            raise ValueError(f"n_steps={self.n_steps}: PrioritizedReplayBuffer keeps "
                             f"1-step transitions only")
        super()._setup_model()

    def _prioritized_sample(self, batch_size: int) -> PrioritizedReplayBufferSamples:
        buffer = self.replay_buffer
        buffer.anneal_beta(1.0 - self._current_progress_remaining)
        return buffer.sample(batch_size, env=self._vec_normalize_env)

    def _set_priorities(self, data: PrioritizedReplayBufferSamples, td: th.Tensor) -> None:
        self.replay_buffer.update_priorities(data.indices, td.detach().abs().reshape(-1))

    def _log_beta(self) -> None:
        self.logger.record("train/per_beta", self.replay_buffer.beta)


class DQN(_Prioritized, _DQN):
    """SB3's DQN on PrioritizedReplayBuffer: the Huber TD loss of each sample is
    weighted by its importance weight, and its priority becomes |TD error|."""

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        losses = []
        for _ in range(gradient_steps):
            data = self._prioritized_sample(batch_size)
            with th.no_grad():
                next_q = self.q_net_target(data.next_observations).max(dim=1).values
                target = data.rewards + (1 - data.dones) * self.gamma * next_q.reshape(-1, 1)
            q = th.gather(self.q_net(data.observations), dim=1, index=data.actions.long())
            loss = (data.weights * F.smooth_l1_loss(q, target, reduction="none")).mean()
            losses.append(loss.item())
            self.policy.optimizer.zero_grad()
            loss.backward()
            th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()
            self._set_priorities(data, q - target)
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", np.mean(losses))
        self._log_beta()


def _weighted_critic_loss(current_qs, target: th.Tensor, weights: th.Tensor) -> th.Tensor:
    """Sum over critics of the importance-weighted mean squared TD error."""
    return sum((weights * (q - target) ** 2).mean() for q in current_qs)


class SAC(_Prioritized, _SAC):
    """SB3's SAC on PrioritizedReplayBuffer: each critic's squared TD error is
    weighted by the importance weights; a sample's priority becomes the mean over
    the critics of |TD error|."""

    def train(self, gradient_steps: int, batch_size: int = 64) -> None:
        self.policy.set_training_mode(True)
        optimizers = [self.actor.optimizer, self.critic.optimizer]
        if self.ent_coef_optimizer is not None:
            optimizers.append(self.ent_coef_optimizer)
        self._update_learning_rate(optimizers)
        ent_coef_losses, ent_coefs, actor_losses, critic_losses = [], [], [], []
        for step in range(gradient_steps):
            data = self._prioritized_sample(batch_size)
            if self.use_sde:
                self.actor.reset_noise()
            actions_pi, log_prob = self.actor.action_log_prob(data.observations)
            log_prob = log_prob.reshape(-1, 1)
            if self.ent_coef_optimizer is not None and self.log_ent_coef is not None:
                ent_coef = th.exp(self.log_ent_coef.detach())
                ent_coef_loss = -(self.log_ent_coef * (log_prob + self.target_entropy).detach()).mean()
                ent_coef_losses.append(ent_coef_loss.item())
                self.ent_coef_optimizer.zero_grad()
                ent_coef_loss.backward()
                self.ent_coef_optimizer.step()
            else:
                ent_coef = self.ent_coef_tensor
            ent_coefs.append(ent_coef.item())

            with th.no_grad():
                next_actions, next_log_prob = self.actor.action_log_prob(data.next_observations)
                next_q = th.cat(self.critic_target(data.next_observations, next_actions), dim=1)
                next_q = next_q.min(dim=1, keepdim=True).values - ent_coef * next_log_prob.reshape(-1, 1)
                target = data.rewards + (1 - data.dones) * self.gamma * next_q
            current_qs = self.critic(data.observations, data.actions)
            critic_loss = 0.5 * _weighted_critic_loss(current_qs, target, data.weights)
            critic_losses.append(critic_loss.item())
            self.critic.optimizer.zero_grad()
            critic_loss.backward()
            self.critic.optimizer.step()
            self._set_priorities(data, th.stack([q - target for q in current_qs]).abs().mean(0))

            q_pi = th.cat(self.critic(data.observations, actions_pi), dim=1)
            actor_loss = (ent_coef * log_prob - q_pi.min(dim=1, keepdim=True).values).mean()
            actor_losses.append(actor_loss.item())
            self.actor.optimizer.zero_grad()
            actor_loss.backward()
            self.actor.optimizer.step()
            if step % self.target_update_interval == 0:
                polyak_update(self.critic.parameters(), self.critic_target.parameters(), self.tau)
                polyak_update(self.batch_norm_stats, self.batch_norm_stats_target, 1.0)
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/ent_coef", np.mean(ent_coefs))
        self.logger.record("train/actor_loss", np.mean(actor_losses))
        self.logger.record("train/critic_loss", np.mean(critic_losses))
        if ent_coef_losses:
            self.logger.record("train/ent_coef_loss", np.mean(ent_coef_losses))
        self._log_beta()


class TD3(_Prioritized, _TD3):
    """SB3's TD3 on PrioritizedReplayBuffer: each critic's squared TD error is
    weighted by the importance weights; a sample's priority becomes the mean over
    the critics of |TD error|."""

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        self.policy.set_training_mode(True)
        self._update_learning_rate([self.actor.optimizer, self.critic.optimizer])
        actor_losses, critic_losses = [], []
        for _ in range(gradient_steps):
            self._n_updates += 1
            data = self._prioritized_sample(batch_size)
            with th.no_grad():
                noise = th.randn_like(data.actions) * self.target_policy_noise
                noise = noise.clamp(-self.target_noise_clip, self.target_noise_clip)
                next_actions = (self.actor_target(data.next_observations) + noise).clamp(-1, 1)
                next_q = th.cat(self.critic_target(data.next_observations, next_actions), dim=1)
                target = data.rewards + (1 - data.dones) * self.gamma * next_q.min(dim=1, keepdim=True).values
            current_qs = self.critic(data.observations, data.actions)
            critic_loss = _weighted_critic_loss(current_qs, target, data.weights)
            critic_losses.append(critic_loss.item())
            self.critic.optimizer.zero_grad()
            critic_loss.backward()
            self.critic.optimizer.step()
            self._set_priorities(data, th.stack([q - target for q in current_qs]).abs().mean(0))

            if self._n_updates % self.policy_delay == 0:
                actor_loss = -self.critic.q1_forward(data.observations, self.actor(data.observations)).mean()
                actor_losses.append(actor_loss.item())
                self.actor.optimizer.zero_grad()
                actor_loss.backward()
                self.actor.optimizer.step()
                polyak_update(self.critic.parameters(), self.critic_target.parameters(), self.tau)
                polyak_update(self.actor.parameters(), self.actor_target.parameters(), self.tau)
                polyak_update(self.critic_batch_norm_stats, self.critic_batch_norm_stats_target, 1.0)
                polyak_update(self.actor_batch_norm_stats, self.actor_batch_norm_stats_target, 1.0)
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        if actor_losses:
            self.logger.record("train/actor_loss", np.mean(actor_losses))
        self.logger.record("train/critic_loss", np.mean(critic_losses))
        self._log_beta()
