"""PAAC (Clemente, Castejon, Chandra 2017, arXiv 1705.04862): synchronous advantage
actor-critic on a batch of environments stepped in lockstep, on the algorithm contract
(`pal_hpc.algos.base`).  On-policy: no replay, one update phase ("ac").

A round is t_max steps of n_e environments.  The master that drives them (see
`pal_hpc.runtime.onpolicy`) hands `compute_gradients` the round's rollout:

    obs         (t_max + 1, n_e, *obs_shape)   s_0 .. s_{t_max}
    action      (t_max, n_e) int64
    reward      (t_max, n_e) float32
    terminated  (t_max, n_e) bool
    truncated   (t_max, n_e) bool
    valid       (t_max, n_e) bool   False on the reset step after an episode's end

The environments reset on the step after an episode ends (gymnasium's next-step
autoreset): on that step the action is ignored, the reward is 0 and the observation
is the new episode's first.  It is no transition, so it is masked out of the loss
(`valid`).  Returns are n-step: R_t = r_t + gamma R_{t+1}, bootstrapped from
V(s_{t_max}), cut to r_t at a termination and to r_t + gamma V(s_{t+1}) at a
truncation (with next-step autoreset, s_{t+1} is then the episode's last
observation).  The loss is the advantage actor-critic one with an entropy bonus,

    -mean(log pi(a_t|s_t) (R_t - V(s_t))) + value_coef mean((R_t - V(s_t))^2)
        - entropy mean(H(pi(.|s_t)))

over the valid steps, and the learning rate anneals linearly to 0 over the run
(`set_progress`).  Masters of several nodes average their gradients with one Allreduce
(the runtime's business) and step the same RMSProp, so they keep identical parameters.

Defaults are the paper's (and its released code's, where the two differ: noted in
`PAACConfig`); the same values train CartPole-v1, with an MLP torso in place of the CNN.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pal_hpc.algos.base import AlgoConfig, Algorithm, NetworkPolicy
from pal_hpc.algos.cnn import KINDS as CNN_KINDS
from pal_hpc.algos.nets import ACTIVATIONS, FlatParams, is_image, seeded, torso
from pal_hpc.algos.optim import FlatRMSProp
from pal_hpc.options import ConfigError
from pal_hpc.options import option as _f

BATCH_KEYS = ("obs", "action", "reward", "terminated", "truncated", "valid")
NUM_ENVS = 32            # per node (the paper's n_e); auto rounds it to the workers
CLIP_CHOICES = ("auto", "on", "off")
RMS_STYLES = ("tf", "torch")
INITS = ("default", "orthogonal")
PRECISIONS = ("fp32", "bf16")
# --paac-preset a2c: A2C's optimizer settings (torch RMSprop as SB3's and OpenAI
# baselines' A2C use it, orthogonal init), the settings that learned Pong here before the
# released code's loss scale was verified (docs/results/paac-pong-n4-10Mframes*.png).
# Each value yields to a flag given for the same field.
PRESETS = {"paper": {},
           "a2c": {"rms_style": "torch", "rms_eps": 1e-5, "lr": 1e-3, "grad_clip": 0.5,
                   "entropy": 0.01, "value_coef": 0.25, "loss_scale": 1.0,
                   "init": "orthogonal"}}


@dataclass
class PAACConfig(AlgoConfig):
    """PAAC's hyper-parameters: the paper's (released code's) values unless noted."""

    paac_preset: str = _f("paper", "paper = the released code's settings (the defaults "
                                   "below); a2c = A2C's optimizer settings: "
                                   + ", ".join(f"{k} {v}" for k, v in PRESETS["a2c"].items())
                                   + ".  A flag given for one of these fields wins over "
                                   "the preset", choices=tuple(PRESETS))
    t_max: int = _f(5, "environment steps per round: each update learns from t_max steps "
                       "of every environment, with n-step returns bootstrapped from "
                       "V(s_{t+t_max})")
    num_envs: int = _f(0, f"environments per node, stepped in lockstep by the node's "
                          f"worker ranks (n_e); must be a multiple of the worker ranks "
                          f"(node ranks - 1).  0 = auto: {NUM_ENVS} (the paper's) rounded "
                          f"up to a multiple of the worker ranks (33 at 3 workers)")
    lr: float = _f(0.0224, "RMSProp learning rate at the start (the paper's 0.0007 x 32 "
                           "environments; it also trains CartPole-v1), annealed linearly "
                           "to 0 over --total-steps (see --lr-anneal)")
    lr_anneal: bool = _f(True, "anneal the learning rate linearly to 0 over --total-steps")
    rms_decay: float = _f(0.99, "RMSProp decay of the mean square (TensorFlow 1's "
                                "RMSPropOptimizer, as PAAC's code used: mean square starts "
                                "at 1, epsilon inside the square root)")
    rms_eps: float = _f(0.1, "RMSProp epsilon (inside the square root with --rms-style tf, "
                             "added to it with torch)")
    rms_style: str = _f("tf", "RMSProp variant: tf = TensorFlow 1's RMSPropOptimizer, which "
                              "PAAC's code used (mean square starts at 1, epsilon inside the "
                              "square root); torch = torch.optim.RMSprop's, which SB3's A2C "
                              "uses (mean square starts at 0, epsilon added to the root)",
                        choices=RMS_STYLES)
    loss_scale: float = _f(5.0, "multiply the loss (so the gradient, before the clip) by "
                                "this: the released code's 5.0 (networks.py), which restores "
                                "the scale its learning rate was tuned for when the loss "
                                "summed over the t_max = 5 steps instead of averaging.  With "
                                "--rms-style tf and its large epsilon the step is nearly "
                                "lr x scale x gradient")
    grad_clip: float = _f(3.0, "global gradient-norm clip (the released code's 3.0; the "
                               "paper says 40; 0 = no clipping)")
    entropy: float = _f(0.02, "entropy bonus coefficient beta (the released code's 0.02; "
                              "the paper says 0.01)")
    value_coef: float = _f(0.25, "weight of the critic's squared-error loss (the released "
                                 "code's 0.25 (R - V)^2, policy_v_network.py)")
    clip_rewards: str = _f("auto", "clip rewards to [-1, 1] in the loss (episode returns "
                                   "are reported unclipped): auto = on image (Atari) "
                                   "observations only", choices=CLIP_CHOICES)
    cnn: str = _f("nips", "torso for image observations: nips (Mnih et al. 2013, the "
                          "paper's) or nature (Mnih et al. 2015)", choices=tuple(CNN_KINDS))
    hidden: list[int] = _f([64, 64], "hidden layer widths of the MLP torso on vector "
                                     "observations")
    activation: str = _f("relu", "activation of the MLP torso on vector observations: relu, "
                                 "or tanh (SB3's MlpPolicy)", choices=tuple(ACTIVATIONS))
    shared_torso: bool = _f(True, "one torso feeds both heads (the paper's); off: the policy "
                                  "and the value each get their own (SB3's MlpPolicy on "
                                  "vector observations; on frames it doubles the CNN work)")
    init: str = _f("default", "weight initialization: default (torch's, with the policy "
                              "head's weights x 0.01) or orthogonal (gain sqrt(2) in the "
                              "torso, 0.01 on the policy head, 1 on the value head, zero "
                              "biases: SB3's and OpenAI baselines' A2C)", choices=INITS)
    precision: str = _f("fp32", "arithmetic of the master's forward and backward passes: fp32, "
                                "or bf16 (torch.autocast to bfloat16: convolutions and "
                                "matrix products in bf16, the parameters, gradients, "
                                "RMSProp and the Allreduce stay fp32; about 2-3x faster "
                                "CNN updates on CPUs with AVX512-BF16 or AMX)",
                        choices=PRECISIONS)
    overlap: bool = _f(True, "overlap each update with the environments' next step: the "
                             "first action of a round is then chosen by the parameters "
                             "before the previous round's update (one step of policy lag "
                             "per round); off = strictly synchronous")
    async_update: bool = _f(False, "with --overlap: compute each round's gradient on a "
                                   "thread while the environments play the whole next "
                                   "round, which acts with the same parameters; the step "
                                   "is taken at that round's end.  Every gradient is then "
                                   "taken one update after the parameters that collected "
                                   "its data (a round of policy lag, as A3C-style "
                                   "asynchronous updates).  The update then hides behind "
                                   "the environments; off = the paper's synchronous rounds")

    def validate(self) -> None:
        super().validate()
        req = self.require
        req("paac_preset", self.paac_preset in PRESETS, f"must be one of {', '.join(PRESETS)}")
        req("t_max", self.t_max >= 1, "must be >= 1")
        req("num_envs", self.num_envs >= 0, "must be >= 0 (0 = auto)")
        req("lr", self.lr > 0, "must be > 0")
        req("rms_decay", 0 <= self.rms_decay < 1, "must be in [0, 1)")
        req("rms_eps", self.rms_eps > 0, "must be > 0")
        req("rms_style", self.rms_style in RMS_STYLES, f"must be one of {', '.join(RMS_STYLES)}")
        req("loss_scale", self.loss_scale > 0 and math.isfinite(self.loss_scale),
            "must be a finite number > 0")
        req("activation", self.activation in ACTIVATIONS,
            f"must be one of {', '.join(ACTIVATIONS)}")
        req("init", self.init in INITS, f"must be one of {', '.join(INITS)}")
        req("async_update", self.overlap or not self.async_update,
            "needs --overlap (it overlaps the update with a whole round instead of one step)")
        req("precision", self.precision in PRECISIONS,
            f"must be one of {', '.join(PRECISIONS)}")
        req("grad_clip", self.grad_clip >= 0, "must be >= 0")
        req("entropy", self.entropy >= 0, "must be >= 0")
        req("value_coef", self.value_coef > 0, "must be > 0")
        req("clip_rewards", self.clip_rewards in CLIP_CHOICES,
            f"must be one of {', '.join(CLIP_CHOICES)}")
        req("cnn", self.cnn in CNN_KINDS, f"must be one of {', '.join(CNN_KINDS)}")
        req("hidden", len(self.hidden) >= 1 and all(h >= 1 for h in self.hidden),
            "must be a non-empty list of positive widths")


def resolve_num_envs(num_envs: int, workers: int) -> int:
    """The environments of a node with `workers` worker ranks (0: the master steps
    them all): `num_envs`, or for 0 (auto) NUM_ENVS rounded up to a multiple of the
    workers.  Raises ConfigError naming num_envs when the workers cannot share
    `num_envs` evenly."""
    if num_envs == 0:
        return NUM_ENVS if workers == 0 else -(-NUM_ENVS // workers) * workers
    if workers and num_envs % workers:
        lo = num_envs // workers * workers
        raise ConfigError(f"num_envs: {num_envs} environments cannot be shared evenly by "
                          f"{workers} worker ranks (a node's ranks but its master); use a "
                          f"multiple of {workers}, e.g. {max(lo, workers)} or {lo + workers}, "
                          f"or 0 (auto)")
    return num_envs


def nstep_returns(rewards: np.ndarray, values: np.ndarray, terminated: np.ndarray,
                  truncated: np.ndarray, gamma: float) -> np.ndarray:
    """n-step returns (T, N) of one round.

    `values` (T + 1, N) are V(s_0) .. V(s_T).  Backwards from R_T = V(s_T):
    R_t = r_t + gamma * R_{t+1}, except at an episode's last step t, where the
    bootstrap is 0 (terminated) or V(s_{t+1}) (truncated: s_{t+1} is the episode's
    last observation under next-step autoreset).  The return of a reset step (the step
    after an episode's end) is meaningless and must be masked by the caller; no valid
    step ever bootstraps from it."""
    rewards = np.asarray(rewards, np.float64)
    values = np.asarray(values, np.float64)
    t_max = rewards.shape[0]
    if values.shape != (t_max + 1, *rewards.shape[1:]):
        raise ValueError(f"values: shape {values.shape}, expected {(t_max + 1, *rewards.shape[1:])}")
    out = np.empty_like(rewards)
    ret = values[t_max]
    for t in range(t_max - 1, -1, -1):
        nxt = np.where(terminated[t], 0.0, np.where(truncated[t], values[t + 1], ret))
        ret = rewards[t] + gamma * nxt
        out[t] = ret
    return out


class ActorCritic(nn.Module):
    """A torso (NIPS/Nature CNN on uint8 frames, an MLP on vectors) with a policy head
    (logits over the actions) and a value head; with `shared=False` the value head has
    a torso of its own."""

    def __init__(self, obs_space: gym.Space, n_actions: int, cnn: str = "nips",
                 hidden: Sequence[int] = (64, 64), activation: str = "relu",
                 shared: bool = True, init: str = "default"):
        super().__init__()
        self.trunk = torso(obs_space, cnn, hidden, activation)
        self.value_trunk = None if shared else torso(obs_space, cnn, hidden, activation)
        self.image = is_image(obs_space)
        self.policy = nn.Linear(self.trunk.out_features, n_actions)
        self.value = nn.Linear(self.trunk.out_features, 1)
        with torch.no_grad():
            if init == "orthogonal":
                for m in self.modules():
                    if isinstance(m, (nn.Linear, nn.Conv2d)):
                        nn.init.orthogonal_(m.weight, math.sqrt(2.0))
                        m.bias.zero_()
                nn.init.orthogonal_(self.policy.weight, 0.01)
                nn.init.orthogonal_(self.value.weight, 1.0)
            else:                         # a near-uniform first policy
                self.policy.weight.mul_(0.01)
                self.policy.bias.zero_()

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits (B, n_actions), values (B,)) of a batch of observations."""
        z = self.trunk(obs)
        zv = z if self.value_trunk is None else self.value_trunk(obs)
        return (F.linear(z, self.policy.weight, self.policy.bias),
                F.linear(zv, self.value.weight, self.value.bias).squeeze(-1))

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        """The policy's logits alone (acting needs no value; with separate torsos this
        skips the value torso)."""
        return F.linear(self.trunk(obs), self.policy.weight, self.policy.bias)


def sample_actions(logits: torch.Tensor, rng: np.random.Generator) -> np.ndarray:
    """One action per row of `logits`, drawn from softmax(logits) with `rng` (numpy:
    its state goes into checkpoints, so a resumed run draws what the original would)."""
    probs = torch.softmax(logits.detach().double(), dim=-1).cpu().numpy()
    cdf = np.cumsum(probs, axis=1)
    u = rng.random(len(cdf))[:, None] * cdf[:, -1:]
    return np.minimum((cdf <= u).sum(axis=1), probs.shape[1] - 1).astype(np.int64)


class PAACPolicy(NetworkPolicy):
    """A CPU copy of the actor-critic: samples from the policy, or (deterministic,
    for evaluation) takes its most likely action."""

    def __init__(self, net: ActorCritic):
        self.obs_dtype = None if net.image else torch.float32
        super().__init__(net)

    @torch.no_grad()
    def act(self, obs, rng, global_steps, deterministic=False):
        logits, _ = self.net(torch.as_tensor(obs, dtype=self.obs_dtype))
        if deterministic:
            return logits.argmax(dim=1).numpy().astype(np.int64)
        return sample_actions(logits, rng)


class PAAC(Algorithm):
    """The actor-critic network, its RMSProp over one flat buffer, the loss.

    `on_policy` tells the runtime to run it on lockstep environments (one master per
    node) instead of actors, replay and learners."""

    name = "paac"
    Config = PAACConfig
    on_policy = True
    metric_names = ("loss", "policy_loss", "value_loss", "entropy", "value_mean",
                    "advantage_abs_mean", "grad_norm", "lr")
    # Evaluations are run by the master and hold up every node: less often than DQN's.
    run_defaults = {"eval_every": 10_000}
    # Named sets of option values (config_from_dict applies the chosen one under the
    # flags a user gave): the field that chooses, and the sets.
    preset_field = "paac_preset"
    presets = PRESETS

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
        self._params = FlatParams([self.net], self.device)
        self._flat, self._flat_grad = self._params.flat, self._params.grad
        tf_style = config.rms_style == "tf"
        self.optimizer = FlatRMSProp(self._flat, lr=self.lr, decay=config.rms_decay,
                                     eps=config.rms_eps, eps_in_sqrt=tf_style,
                                     initial_square=1.0 if tf_style else 0.0)
        self.updates = 0
        self.progress = 0.0           # fraction of the run done: anneals the learning rate
        self._last_grad_norm = float("nan")

    @classmethod
    def check_env(cls, env_id, obs_space, act_space) -> None:
        cls.needs(gym.spaces.Discrete, env_id, act_space)

    # ---- acting ---------------------------------------------------------------------

    def make_policy(self, actor_index: int = 0, n_actors: int = 1) -> PAACPolicy:
        net = copy.deepcopy(self.net).cpu().requires_grad_(False)
        return PAACPolicy(net)

    def policy_params(self) -> np.ndarray:
        return self._flat.detach().cpu().numpy().astype(np.float32, copy=True)

    @torch.inference_mode()
    def act(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Sampled actions (N,) int64 for a batch of observations: the master's batched
        forward pass, on its device."""
        x = self._obs(obs)
        if not self.bf16:
            return sample_actions(self.net.logits(x), rng)
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

    def set_progress(self, fraction: float) -> None:
        """The fraction of the run's env steps done (the same on every master)."""
        self.progress = float(fraction)

    def phases(self, update: int) -> tuple[str, ...]:
        return ("ac",)

    def phase_size(self, phase: str) -> int:
        self._check_phase(phase)
        return self.num_params

    def loss(self, batch: dict[str, np.ndarray], metrics: bool = True
             ) -> tuple[torch.Tensor, dict[str, float]]:
        """The advantage actor-critic loss of one round (see the module docstring) and,
        when `metrics`, its parts."""
        missing = [k for k in BATCH_KEYS if k not in batch]
        if missing:
            raise KeyError(f"paac batch lacks {missing}")
        obs = batch["obs"]
        t_max, n = np.shape(batch["reward"])
        logits, values = self._forward(self._obs(obs.reshape(((t_max + 1) * n,
                                                                *obs.shape[2:]))))
        logits = logits.view(t_max + 1, n, -1)[:t_max]
        values = values.view(t_max + 1, n)
        rewards = np.asarray(batch["reward"], np.float64)
        if self.clip_rewards:
            rewards = np.clip(rewards, -1.0, 1.0)
        returns = torch.as_tensor(
            nstep_returns(rewards, values.detach().cpu().numpy(), batch["terminated"],
                          batch["truncated"], self.gamma), dtype=torch.float32,
            device=self.device)
        mask = torch.as_tensor(np.asarray(batch["valid"]), dtype=torch.float32,
                               device=self.device)
        count = mask.sum().clamp(min=1.0)
        v = values[:t_max]
        adv = returns - v.detach()
        log_probs = torch.log_softmax(logits, dim=-1)
        action = torch.as_tensor(np.asarray(batch["action"]), dtype=torch.int64,
                                 device=self.device)
        log_pi = log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        policy_loss = -(log_pi * adv * mask).sum() / count
        value_loss = ((returns - v) ** 2 * mask).sum() / count
        mean_entropy = (entropy * mask).sum() / count
        total = self.config.loss_scale * (policy_loss + self.config.value_coef * value_loss
                                          - self.config.entropy * mean_entropy)
        stats: dict[str, float] = {}
        if metrics:
            parts = torch.stack([total.detach(), policy_loss.detach(), value_loss.detach(),
                                 mean_entropy.detach(), (v.detach() * mask).sum() / count,
                                 (adv.abs() * mask).sum() / count]).tolist()
            stats = dict(zip(("loss", "policy_loss", "value_loss", "entropy", "value_mean",
                              "advantage_abs_mean"), parts))
        return total, stats

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
        self.updates += 1

    def _check_phase(self, phase: str) -> None:
        if phase != "ac":
            raise ValueError(f"paac has one update phase, 'ac'; got {phase!r}")

    # ---- parameters and checkpoints ------------------------------------------------------

    @property
    def num_params(self) -> int:
        return self._flat.numel()

    @torch.no_grad()
    def set_flat_params(self, flat: np.ndarray) -> None:
        """Load parameters from a vector laid out as `policy_params`'s (a copy)."""
        flat_t = torch.as_tensor(np.asarray(flat, dtype=np.float32), device=self.device)
        if flat_t.numel() != self.num_params:
            raise ValueError(f"vector has {flat_t.numel()} entries, expected {self.num_params}")
        self._flat.copy_(flat_t)

    def state_arrays(self) -> list[np.ndarray]:
        return [self.policy_params(),
                self.optimizer.square_avg.detach().cpu().numpy()]

    def state_dict(self) -> dict:
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict(),
                "updates": self.updates, "progress": self.progress}

    def load_state_dict(self, state: dict) -> None:
        self.net.load_state_dict(state["net"])
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
