"""PAAC (Clemente, Castejon, Chandra 2017, arXiv 1705.04862), the algorithm on the
contract of `pal_hpc.algos.base`: synchronous advantage actor-critic on a batch of
environments stepped in lockstep.  On-policy: no replay, one update phase ("ac").

The class holds the network (`network`), its parameters in one flat buffer with an
RMSProp over it (TensorFlow 1's, as PAAC's code used, or torch's: `pal_hpc.algos.optim`),
and the learning-rate schedule; the loss is `loss.actor_critic_loss`.  The learning
rate anneals linearly to 0 over the run (`set_progress`).  Masters of several nodes
average their gradients with one Allreduce (the runtime's business) and step the same
RMSProp, so they keep identical parameters.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import torch

from pal_hpc.algos.onpolicy import OnPolicyAlgorithm
from pal_hpc.algos.nets import FlatParams, is_image, seeded
from pal_hpc.algos.optim import FlatRMSProp
from pal_hpc.algos.paac.config import PAACConfig, PAACSpec
from pal_hpc.algos.paac.loss import actor_critic_loss, check_batch
from pal_hpc.algos.paac.network import ActorCritic, NumpyLogits, PAACPolicy, sample_actions
from pal_hpc.algos.paac.numpy_grad import NumpyGrad
from pal_hpc.options import ConfigError


class PAAC(PAACSpec, OnPolicyAlgorithm):
    """The actor-critic network, its RMSProp over one flat buffer, the loss.

    `on_policy` tells the runtime to run it on lockstep environments (one master per
    node) instead of actors, replay and learners."""

    phase = "ac"
    metric_names = ("loss", "policy_loss", "value_loss", "entropy", "value_mean",
                    "advantage_abs_mean", "grad_norm", "lr")

    def __init__(self, obs_space: gym.Space, act_space: gym.Space,
                 config: PAACConfig | None = None, *, device: str | torch.device = "cpu",
                 seed: int = 0, gamma: float = 0.99):
        config = config or PAACConfig()
        super().__init__(obs_space, act_space, config, device=device, seed=seed)
        if not 0 < gamma <= 1:
            raise ConfigError(f"gamma: must be in (0, 1], got {gamma!r}")
        self.gamma = float(gamma)
        self.image = is_image(obs_space)
        self.n_actions = int(act_space.n)
        self.device = torch.device(device)
        self.lr = config.lr
        self.bf16 = config.precision == "bf16"
        self.clip_rewards = (config.clip_rewards == "on"
                             or (config.clip_rewards == "auto" and self.image))
        self.net = seeded(seed, lambda: ActorCritic(
            obs_space, self.n_actions, config.cnn, tuple(config.hidden), config.activation,
            config.shared_torso, config.init))
        self.net.to(self.device)
        # Small MLPs on the CPU act through numpy: torch's per-op cost is most of it.
        self._np_logits = (NumpyLogits(self.net)
                           if NumpyLogits.fits(self.net, self.device, self.bf16) else None)
        # ... and take their gradient through numpy too (numpy_grad; autograd otherwise).
        self._np_grad = (NumpyGrad(self.net)
                         if NumpyGrad.fits(self.net, self.device, self.bf16) else None)
        self._params = FlatParams([self.net], self.device)
        self._flat, self._flat_grad = self._params.flat, self._params.grad
        tf_style = config.rms_style == "tf"
        self.optimizer = FlatRMSProp(self._flat, lr=self.lr, decay=config.rms_decay,
                                     eps=config.rms_eps, eps_in_sqrt=tf_style,
                                     initial_square=1.0 if tf_style else 0.0)
        self.updates = 0
        self.progress = 0.0           # fraction of the run done: anneals the learning rate
        self._last_grad_norm = float("nan")

    # ---- acting ---------------------------------------------------------------------

    def make_policy(self, actor_index: int = 0, n_actors: int = 1) -> PAACPolicy:
        net = copy.deepcopy(self.net).cpu().requires_grad_(False)
        return PAACPolicy(net)

    def policy_params(self) -> np.ndarray:
        return self.get_flat_params()

    def act(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Sampled actions (N,) int64 for a batch of observations: the master's batched
        forward pass, on its device."""
        if self._np_logits is not None:
            return sample_actions(self._np_logits(obs), rng)
        return self._act_torch(obs, rng)

    @torch.inference_mode()
    def _act_torch(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        x = self._obs(obs)
        if not self.bf16:
            return sample_actions(self.net.logits(x), rng)
        # Under autocast, not through nets.Bf16Acting as PPO: at 32 envs an act the copy
        # saves nothing measurable, and with --async-update's gradient thread beside it
        # -n 2 Pong ran at a median 1,789 env steps/s against 1,992 (6 and 5 runs).
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            logits = self.net.logits(x)
        return sample_actions(logits.float(), rng)

    def _forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The network on `obs` at --precision; logits and values come back float32."""
        if not self.bf16:
            return self.net(obs)
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            logits, values = self.net(obs)
        return logits.float(), values.float()

    # ---- learning ---------------------------------------------------------------------

    def learning_rate(self, progress: float | None = None) -> float:
        """lr * (1 - progress) with annealing on (never below 0), else lr."""
        p = self.progress if progress is None else progress
        return self.lr * max(0.0, 1.0 - p) if self.config.lr_anneal else self.lr

    def anneal_progress(self, done_steps: int, total_steps: int) -> float:
        """The annealing's fraction done after `done_steps` env steps: over
        --lr-anneal-steps when set, else over the run's `total_steps`; at most 1."""
        horizon = self.config.lr_anneal_steps or total_steps
        return min(1.0, done_steps / horizon)

    def set_progress(self, fraction: float) -> None:
        """The fraction of the run's env steps done (the same on every master)."""
        self.progress = float(fraction)

    def loss(self, batch: dict[str, np.ndarray], metrics: bool = True
             ) -> tuple[torch.Tensor, dict[str, float]]:
        """The advantage actor-critic loss of one round (`loss.actor_critic_loss`) and,
        when `metrics`, its parts."""
        check_batch(batch)
        obs = batch["obs"]
        t_max, n = np.shape(batch["reward"])
        logits, values = self._forward(self._obs(obs.reshape(((t_max + 1) * n,
                                                                *obs.shape[2:]))))
        cfg = self.config
        return actor_critic_loss(logits.view(t_max + 1, n, -1), values.view(t_max + 1, n),
                                 batch, gamma=self.gamma, clip_rewards=self.clip_rewards,
                                 loss_scale=cfg.loss_scale, value_coef=cfg.value_coef,
                                 entropy_coef=cfg.entropy, metrics=metrics)

    def compute_gradients(self, phase: str, batch: dict[str, np.ndarray], out: np.ndarray,
                          metrics: bool = False) -> tuple[dict[str, float], None]:
        """The loss's gradient into `out` (float32, num_params); (metrics -- with the
        gradient's norm and this step's learning rate; {} unless `metrics` --, None:
        no priorities)."""
        self._check_phase(phase)
        if (not isinstance(out, np.ndarray) or out.dtype != np.float32
                or out.shape != (self.num_params,)):
            raise ValueError(f"out must be float32 of shape ({self.num_params},), got "
                             f"{getattr(out, 'dtype', out)} {getattr(out, 'shape', '')}")
        if self._np_grad is not None:
            check_batch(batch)
            cfg = self.config
            stats = self._np_grad(batch, gamma=self.gamma, clip_rewards=self.clip_rewards,
                                  loss_scale=cfg.loss_scale, value_coef=cfg.value_coef,
                                  entropy_coef=cfg.entropy, metrics=metrics)
        else:
            self._flat_grad.zero_()
            loss, stats = self.loss(batch, metrics)
            loss.backward()
        if metrics:
            stats["grad_norm"] = torch.linalg.vector_norm(self._flat_grad).item()
            stats["lr"] = self.learning_rate()
        out[...] = self._flat_grad.cpu().numpy()
        return stats, None

    def apply_gradients(self, phase: str, flat_grad: np.ndarray, scale: float = 1.0) -> None:
        """Take `flat_grad * scale` (scale = 1/masters turns the Allreduce sum into the
        mean), clip its global norm to grad_clip, and take one RMSProp step at the
        annealed learning rate."""
        self._check_phase(phase)
        flat = torch.as_tensor(np.asarray(flat_grad, dtype=np.float32), device=self.device)
        if flat.numel() != self.num_params:
            raise ValueError(f"gradient has {flat.numel()} entries, expected {self.num_params}")
        torch.mul(flat, scale, out=self._flat_grad)
        self.optimizer.step(self._flat_grad, clip_norm=self.config.grad_clip,
                            lr=self.learning_rate())
        self.params_written()
        self.updates += 1

    # ---- parameters and checkpoints ------------------------------------------------------

    def state_arrays(self) -> list[np.ndarray]:
        return [self.policy_params(),
                self.optimizer.square_avg.detach().cpu().numpy()]

    def state_dict(self) -> dict:
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict(),
                "updates": self.updates, "progress": self.progress}

    def load_state_dict(self, state: dict) -> None:
        self.net.load_state_dict(state["net"])
        self.params_written()
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        self.progress = float(state["progress"])

    def signature(self) -> dict:
        sig = {**super().signature(), "shared_torso": bool(self.config.shared_torso)}
        if self.image:
            sig["cnn"] = self.config.cnn
        else:
            sig["hidden"] = list(self.config.hidden)
            sig["activation"] = self.config.activation
        return sig

    def _obs(self, x: np.ndarray) -> torch.Tensor:
        """Frames stay uint8 (the CNN torso scales them); vectors become float32."""
        if self.image:
            return torch.as_tensor(x, device=self.device)
        return torch.as_tensor(x, dtype=torch.float32, device=self.device)
