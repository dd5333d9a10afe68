"""The hyper-parameters of the off-policy algorithms (DQN, DDPG, TD3, SAC) and their
specs: what the configuration layer reads of each, without torch (`pal_hpc.algos.spec`).
The algorithms themselves are in dqn.py, ddpg.py, td3.py and sac.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pal_hpc.algos.spec import CNN_NAMES, PRECISIONS, AlgoConfig, AlgoSpec, precision_option
from pal_hpc.options import option as _f

LOSSES = ("huber", "mse")


@dataclass
class DQNConfig(AlgoConfig):
    """DQN's hyper-parameters (the defaults reach CartPole's 475 in ~15k steps)."""

    lr: float = _f(2.3e-3, "Adam learning rate (Atari ids: 6.25e-5, Dopamine's Rainbow)")
    adam_eps: float = _f(1e-8, "Adam epsilon (Atari ids: 1.5e-4, Dopamine's Rainbow)")
    target_update: int = _f(50, "learner steps between target-network syncs (Atari ids: "
                                "2000 = 8000 env steps at one update per 4)")
    hidden: list[int] = _f([256, 256], "hidden layer widths of the network(s)")
    dueling: bool = _f(False, "dueling Q-network head (Atari ids: on)")
    cnn: str = _f("nature", "torso for image observations (uint8 frames, e.g. Atari) in "
                            "place of the hidden MLP: nature (Mnih et al. 2015) or nips "
                            "(Mnih et al. 2013, PAAC's)", choices=CNN_NAMES)
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
    precision: str = precision_option()

    def validate(self) -> None:
        super().validate()
        req = self.require
        req("lr", self.lr > 0, "must be > 0")
        req("adam_eps", self.adam_eps > 0, "must be > 0")
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


class DDPGSpec(AlgoSpec):
    name = "ddpg"
    Config = DDPGConfig
    run_defaults: ClassVar[dict] = ZOO_PENDULUM_RUN_DEFAULTS


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


class SACSpec(AlgoSpec):
    name = "sac"
    Config = SACConfig
    # Run-wide defaults SAC wants when the user gives none (SB3's SAC; the runtime applies them).
    run_defaults: ClassVar[dict] = {"gamma": 0.99, "batch_size": 256, "learning_starts": 100,
                                    "replay_ratio": 256.0, "n_step": 1,
                                    "replay_capacity": 1_000_000}
