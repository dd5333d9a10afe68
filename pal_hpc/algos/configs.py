"""The hyper-parameters of the off-policy algorithms (DQN, DDPG, TD3, SAC) and their
specs: what the configuration layer reads of each, without torch (`pal_hpc.algos.spec`).
The algorithms themselves are in dqn.py, ddpg.py, td3.py and sac.py."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from pal_hpc.algos.spec import (CNN_NAMES, MINATAR, PRECISIONS, AlgoConfig, AlgoSpec,
                                conv_out, is_image, precision_option)
from pal_hpc.options import option as _f

LOSSES = ("huber", "mse")
OPTIMIZERS = ("adam", "rmsprop")


# What a MinAtar id takes under --minatar-preset, for the fields the user did not set:
# run-wide ones (MINATAR_RUN_FIELDS) and DQN's own.
MINATAR_RUN_FIELDS = ("replay_capacity", "batch_size", "learning_starts", "replay_ratio",
                      "n_step", "per_alpha", "gamma", "reward_clip", "total_steps",
                      "eval_every")
MINATAR_PRESETS = {
    # The MinAtar paper's DQN (Young & Tian 2019; its examples/dqn.py): replay 100k,
    # batch 32, one update per env step after 5,000 steps, target every 1,000 updates,
    # epsilon 1 -> 0.1 over 100k steps, centered RMSProp 2.5e-4 (decay 0.95, eps 0.01),
    # Huber loss, gamma 0.99, no double-Q, no dueling head, uniform replay, 1-step
    # returns, rewards as they are; 5M steps.
    "paper": {
        "replay_capacity": 100_000, "batch_size": 32, "learning_starts": 5_000,
        "replay_ratio": 32.0, "n_step": 1, "per_alpha": 0.0, "gamma": 0.99,
        "reward_clip": False, "total_steps": 5_000_000, "eval_every": 100_000,
        "optimizer": "rmsprop", "lr": 2.5e-4, "rms_decay": 0.95, "rms_eps": 0.01,
        "target_update": 1_000, "dueling": False, "double_q": False, "cnn": "minatar",
        "loss": "huber", "grad_clip": 0.0, "eps_start": 1.0, "eps_final": 0.1,
        "exploration_steps": 100_000, "eps_spread": 0.0},
    # Revisiting Rainbow's DQN on MinAtar (Obando-Ceron & Castro 2021; its
    # Configs/dqn_<game>.gin over Dopamine's JaxDQNAgent defaults): Adam 2.5e-4 with
    # eps 3.125e-4, 1,000 steps before learning, one update of 32 every 4 env steps,
    # target every 1,000 env steps (250 updates), epsilon to 0.01 over 250k steps,
    # replay 100k uniform, 1-step, Huber, gamma 0.99; 10M steps.  Its Rainbow adds
    # n-step 3 and prioritized replay (--n-step 3 --per-alpha 0.5).  The network stays
    # the MinAtar paper's (its own -- a 3-D convolution straight into the output
    # layer -- is not built here).
    "revisiting-rainbow": {
        "replay_capacity": 100_000, "batch_size": 32, "learning_starts": 1_000,
        "replay_ratio": 8.0, "n_step": 1, "per_alpha": 0.0, "gamma": 0.99,
        "reward_clip": False, "total_steps": 10_000_000, "eval_every": 100_000,
        "optimizer": "adam", "lr": 2.5e-4, "adam_eps": 3.125e-4,
        "target_update": 250, "dueling": False, "double_q": False, "cnn": "minatar",
        "loss": "huber", "grad_clip": 0.0, "eps_start": 1.0, "eps_final": 0.01,
        "exploration_steps": 250_000, "eps_spread": 0.0},
}


def minatar_defaults(env_id, preset: str) -> dict:
    """The values of --minatar-preset `preset` when `env_id` is a MinAtar game, else
    none (the check imports gymnasium only for MinAtar/ ids)."""
    if not (isinstance(env_id, str) and env_id.startswith("MinAtar/")):
        return {}
    from pal_hpc.envs.make import is_minatar
    return dict(MINATAR_PRESETS.get(preset, {})) if is_minatar(env_id) else {}


@dataclass
class DQNConfig(AlgoConfig):
    """DQN's hyper-parameters (the defaults reach CartPole's 475 in ~15k steps)."""

    lr: float = _f(2.3e-3, "learning rate (Atari ids: 6.25e-5, Dopamine's Rainbow; MinAtar "
                           "ids: 2.5e-4, the MinAtar paper's)")
    optimizer: str = _f("adam", "adam, or rmsprop: centered RMSProp as torch.optim.RMSprop("
                                "centered=True) with rms_decay and rms_eps (MinAtar ids: "
                                "rmsprop, the paper's)", choices=OPTIMIZERS)
    adam_eps: float = _f(1e-8, "Adam epsilon (Atari ids: 1.5e-4, Dopamine's Rainbow)")
    rms_decay: float = _f(0.95, "RMSProp's decay of the mean square and mean gradient")
    rms_eps: float = _f(0.01, "RMSProp's epsilon, added to the root (MinAtar's "
                              "MIN_SQUARED_GRAD)")
    target_update: int = _f(50, "learner steps between target-network syncs (Atari ids: "
                                "2000 = 8000 env steps at one update per 4)")
    hidden: list[int] = _f([256, 256], "hidden layer widths of the network(s)")
    dueling: bool = _f(False, "dueling Q-network head (Atari ids: on)")
    cnn: str = _f("nature", "torso for image observations (uint8 frames, e.g. Atari) in "
                            "place of the hidden MLP: nature (Mnih et al. 2015), nips "
                            "(Mnih et al. 2013, PAAC's) or minatar (Young & Tian 2019; "
                            "MinAtar ids' default)", choices=CNN_NAMES)
    double_q: bool = _f(True, "double-Q targets")
    loss: str = _f("huber", "TD loss: huber (smooth L1) or mse (the squared TD error)",
                   choices=LOSSES)
    grad_clip: float = _f(10.0, "gradient global-norm clip (0 = no clipping)")
    eps_start: float = _f(1.0, "initial epsilon of epsilon-greedy")
    eps_final: float = _f(0.04, "final epsilon (of actor 0 when eps_spread > 0; Atari ids: "
                                "0.01)")
    exploration_steps: int = _f(8_000, "global env steps of linear epsilon decay (Atari ids: "
                                       "250,000)")
    eps_spread: float = _f(3.0, "actor i of N ends at eps_final ** (1 + eps_spread * i / "
                                "(N-1)), Ape-X style (0 = all actors equal; Atari ids: 0)")
    minatar_preset: str = _f("paper", "what MinAtar ids take for the options not given: "
                                      "paper (the MinAtar paper's DQN) or "
                                      "revisiting-rainbow (Obando-Ceron & Castro 2021's "
                                      "DQN settings); other ids ignore it",
                             choices=tuple(MINATAR_PRESETS))
    precision: str = precision_option()

    def validate(self) -> None:
        super().validate()
        req = self.require
        req("lr", self.lr > 0, "must be > 0")
        req("minatar_preset", self.minatar_preset in MINATAR_PRESETS,
            f"must be one of {', '.join(MINATAR_PRESETS)}")
        req("adam_eps", self.adam_eps > 0, "must be > 0")
        req("optimizer", self.optimizer in OPTIMIZERS, f"must be one of {', '.join(OPTIMIZERS)}")
        req("rms_decay", 0 <= self.rms_decay < 1, "must be in [0, 1)")
        req("rms_eps", self.rms_eps > 0, "must be > 0")
        req("target_update", self.target_update >= 1, "must be >= 1")
        req("hidden", len(self.hidden) >= 1 and all(h >= 1 for h in self.hidden),
            "must be a non-empty list of positive widths")
        req("cnn", self.cnn in CNN_NAMES,
            f"must be one of {', '.join(CNN_NAMES)}")
        req("grad_clip", self.grad_clip >= 0, "must be >= 0")
        req("loss", self.loss in LOSSES, f"must be one of {', '.join(LOSSES)}")
        for name in ("eps_start", "eps_final"):
            req(name, 0 <= getattr(self, name) <= 1, "must be in [0, 1]")
        req("eps_final", self.eps_final <= self.eps_start,
            f"must be <= eps_start ({self.eps_start})")
        req("exploration_steps", self.exploration_steps >= 0, "must be >= 0")
        req("eps_spread", self.eps_spread >= 0, "must be >= 0")
        req("precision", self.precision in PRECISIONS, f"must be one of {', '.join(PRECISIONS)}")


class DQNSpec(AlgoSpec):
    name = "dqn"
    Config = DQNConfig
    # Defaults for Atari ids (docs/training.md, "DQN on Atari"): Dopamine's Rainbow settings for
    # what DQN shares with it (n-step 3, PER with alpha 0.5, Adam at 6.25e-5 with eps
    # 1.5e-4, 20k steps before learning, one update of 32 every 4 env steps, target
    # every 8000 env steps, epsilon to 0.01 over 250k steps, 1M transitions), with
    # double-Q, a dueling head and the Nature CNN, rewards clipped for learning.
    atari_run_defaults: ClassVar[dict] = {
        "replay_capacity": 0, "n_step": 3, "batch_size": 32, "learning_starts": 20_000,
        "replay_ratio": 8.0, "per_alpha": 0.5, "reward_clip": True,
        # Ten greedy Pong games take ~80 s on the evaluating actor: evaluate rarely.
        "eval_every": 100_000,
        # 4M frames, the standard short Atari budget (the 100k default is random play).
        "total_steps": 1_000_000}
    atari_defaults: ClassVar[dict] = {
        "lr": 6.25e-5, "adam_eps": 1.5e-4, "target_update": 2_000, "dueling": True,
        "double_q": True, "cnn": "nature", "eps_final": 0.01, "exploration_steps": 250_000,
        "eps_spread": 0.0}
    # MinAtar ids: the settings of --minatar-preset (MINATAR_PRESETS, docs/minatar.md).
    preset_field = "minatar_preset"
    env_defaults = staticmethod(minatar_defaults)
    metric_names = ("loss", "td_abs_mean", "q_mean", "grad_norm")

    @classmethod
    def check_env(cls, env_id, obs_space, act_space) -> None:
        import gymnasium as gym

        cls.needs(gym.spaces.Discrete, env_id, act_space)

    @classmethod
    def signature_of(cls, obs_space, act_space, config) -> dict:
        sig = {**super().signature_of(obs_space, act_space, config),
               "hidden": list(config.hidden), "dueling": config.dueling}
        if is_image(obs_space):
            sig["cnn"] = config.cnn
        return sig

    @classmethod
    def numpy_policy(cls, obs_space, act_space, config, actor_index, n_actors):
        """`acting.QPolicy` on vectors and on MinAtar's network; the Atari CNNs act
        through torch."""
        from pal_hpc.algos import acting

        n = int(act_space.n)
        if not is_image(obs_space):
            q = acting.QValues(math.prod(obs_space.shape), tuple(config.hidden), n,
                               config.dueling)
        elif config.cnn == "minatar":
            (filters, kernel, stride), = MINATAR[0]
            _, h, w = obs_space.shape
            if conv_out(min(h, w), MINATAR[0]) < 1:
                return None            # the torso refuses such frames, naming them
            q = acting.MinAtarQValues(obs_space.shape, filters, kernel, stride, MINATAR[1],
                                      n, config.dueling)
        else:
            return None
        return acting.QPolicy(q, config, actor_index, n_actors)


# The run-wide defaults of the rl-baselines3-zoo Pendulum recipe (1 gradient step of
# 256 per env step after 10k random steps), which the runtime applies where the user
# gave none.
ZOO_PENDULUM_RUN_DEFAULTS = {"gamma": 0.98, "batch_size": 256, "learning_starts": 10_000,
                             "replay_ratio": 256.0, "n_step": 1, "replay_capacity": 200_000}


@dataclass
class DDPGConfig(AlgoConfig):
    """DDPG's hyper-parameters (defaults: rl-baselines3-zoo's Pendulum recipe)."""

    actor_lr: float = _f(1e-3, "Adam learning rate of the actor")
    critic_lr: float = _f(1e-3, "Adam learning rate of the critic(s)")
    tau: float = _f(0.005, "Polyak rate of the target networks (1 = hard copy)")
    hidden: list[int] = _f([400, 300], "hidden layer widths of actor and critic(s)")
    grad_clip: float = _f(0.0, "gradient global-norm clip per phase (0 = no clipping)")
    action_noise: float = _f(0.1, "std of the Gaussian exploration noise (of actor 0 "
                                  "when noise_spread > 0), in [-1, 1] action units")
    noise_spread: float = _f(1.0, "actor i of N explores with std action_noise * (1 + "
                                  "noise_spread * i / (N-1)) (0 = all actors equal)")
    random_steps: int = _f(10_000, "global env steps of uniform random actions before "
                                   "the actors use the policy")
    precision: str = precision_option()

    def validate(self) -> None:
        super().validate()
        req = self.require
        for name in ("actor_lr", "critic_lr"):
            req(name, getattr(self, name) > 0, "must be > 0")
        req("tau", 0 < self.tau <= 1, "must be in (0, 1]")
        req("hidden", len(self.hidden) >= 1 and all(int(h) == h and h >= 1 for h in self.hidden),
            "must be a non-empty list of positive widths")
        for name in ("grad_clip", "action_noise", "noise_spread", "random_steps"):
            req(name, getattr(self, name) >= 0, "must be >= 0")
        req("precision", self.precision in PRECISIONS, f"must be one of {', '.join(PRECISIONS)}")


class BoxSpec(AlgoSpec):
    """DDPG's, TD3's and SAC's: a Box action space, MLPs of `hidden` widths."""

    @classmethod
    def check_env(cls, env_id, obs_space, act_space) -> None:
        import gymnasium as gym

        cls.needs(gym.spaces.Box, env_id, act_space)

    @classmethod
    def signature_of(cls, obs_space, act_space, config) -> dict:
        return {**super().signature_of(obs_space, act_space, config),
                "hidden": list(config.hidden)}


class DDPGSpec(BoxSpec):
    name = "ddpg"
    Config = DDPGConfig
    run_defaults: ClassVar[dict] = ZOO_PENDULUM_RUN_DEFAULTS
    metric_names = ("critic_loss", "actor_loss", "q_mean", "td_abs_mean")

    @classmethod
    def numpy_policy(cls, obs_space, act_space, config, actor_index, n_actors):
        """`acting.DeterministicPolicy`, with this actor's noise (`actor_sigma`)."""
        from pal_hpc.algos.acting import DeterministicPolicy, actor_sigma

        return DeterministicPolicy(math.prod(obs_space.shape), math.prod(act_space.shape),
                                   tuple(config.hidden),
                                   actor_sigma(config, actor_index, n_actors),
                                   config.random_steps)


@dataclass
class TD3Config(DDPGConfig):
    """TD3's hyper-parameters: DDPG's plus the delay and the target smoothing."""

    policy_delay: int = _f(2, "critic updates per actor (and target) update")
    target_noise: float = _f(0.2, "std of the target policy smoothing noise")
    noise_clip: float = _f(0.5, "target smoothing noise is clipped to +-noise_clip")

    def validate(self) -> None:
        super().validate()
        self.require("policy_delay", self.policy_delay >= 1, "must be >= 1")
        for name in ("target_noise", "noise_clip"):
            self.require(name, getattr(self, name) >= 0, "must be >= 0")


class TD3Spec(DDPGSpec):
    name = "td3"
    Config = TD3Config


@dataclass
class SACConfig(AlgoConfig):
    """SAC's hyper-parameters (defaults: Stable-Baselines3's SAC)."""

    lr: float = _f(3e-4, "Adam learning rate of the critics, the actor and the temperature")
    tau: float = _f(0.005, "Polyak rate of the target critics, after every critic update")
    hidden: list[int] = _f([256, 256], "hidden layer widths of the actor and each critic")
    init_alpha: float = _f(1.0, "initial entropy temperature alpha")
    target_entropy: float | None = _f(None, "entropy the temperature steers to "
                                            "(none = -action dimensions)")
    random_steps: int = _f(100, "global env steps of uniform random actions before the "
                                "policy acts")
    grad_clip: float = _f(0.0, "global-norm clip of the critic and the actor gradients, "
                               "each apart (0 = no clipping)")
    precision: str = precision_option()

    def validate(self) -> None:
        super().validate()
        req = self.require
        req("lr", self.lr > 0, "must be > 0")
        req("tau", 0 < self.tau <= 1, "must be in (0, 1]")
        req("hidden", len(self.hidden) >= 1 and all(h >= 1 for h in self.hidden),
            "must be a non-empty list of positive widths")
        req("init_alpha", self.init_alpha > 0, "must be > 0")
        req("random_steps", self.random_steps >= 0, "must be >= 0")
        req("grad_clip", self.grad_clip >= 0, "must be >= 0")
        req("precision", self.precision in PRECISIONS, f"must be one of {', '.join(PRECISIONS)}")


class SACSpec(BoxSpec):
    name = "sac"
    Config = SACConfig
    # Run-wide defaults SAC wants when the user gives none (SB3's SAC; the runtime applies them).
    run_defaults: ClassVar[dict] = {"gamma": 0.99, "batch_size": 256, "learning_starts": 100,
                                    "replay_ratio": 256.0, "n_step": 1,
                                    "replay_capacity": 1_000_000}
    metric_names = ("critic_loss", "actor_loss", "alpha", "entropy", "q_mean", "td_abs_mean")

    @classmethod
    def numpy_policy(cls, obs_space, act_space, config, actor_index, n_actors):
        """`acting.SquashedGaussianPolicy`."""
        from pal_hpc.algos.acting import SquashedGaussianPolicy

        return SquashedGaussianPolicy(math.prod(obs_space.shape), math.prod(act_space.shape),
                                      tuple(config.hidden), config.random_steps)
