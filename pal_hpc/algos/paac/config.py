"""PAAC's hyper-parameters (PAACConfig, its flags), the named presets, and the rule
that sizes a node's environments to its worker ranks (resolve_num_envs).

Defaults are the paper's (and its released code's, where the two differ: noted in
`PAACConfig`); the same values train CartPole-v1, with an MLP torso in place of the CNN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pal_hpc.algos.spec import ACTIVATION_NAMES, CNN_NAMES, AlgoConfig, AlgoSpec
from pal_hpc.options import ConfigError
from pal_hpc.options import option as _f

NUM_ENVS = 32            # per node (the paper's n_e); auto rounds it to the workers
CLIP_CHOICES = ("auto", "on", "off")
RMS_STYLES = ("tf", "torch")
INITS = ("torch", "small-policy", "orthogonal")
# The name small-policy had before the released code's init became the default.
INIT_ALIASES = {"default": "small-policy"}
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
    lr_anneal_steps: int = _f(0, "env steps (all environments of all nodes together) over "
                                 "which the learning rate anneals to 0; 0 = --total-steps.  "
                                 "The released code anneals over its 80M-step budget "
                                 "whatever the run's length: --lr-anneal-steps 80000000")
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
                          "paper's), nature (Mnih et al. 2015) or minatar (Young & "
                          "Tian 2019; MinAtar ids' default)", choices=CNN_NAMES)
    hidden: list[int] = _f([64, 64], "hidden layer widths of the MLP torso on vector "
                                     "observations")
    activation: str = _f("relu", "activation of the MLP torso on vector observations: relu, "
                                 "or tanh (SB3's MlpPolicy)", choices=ACTIVATION_NAMES)
    shared_torso: bool = _f(True, "one torso feeds both heads (the paper's); off: the policy "
                                  "and the value each get their own (SB3's MlpPolicy on "
                                  "vector observations; on frames it doubles the CNN work)")
    init: str = _f("torch", "weight initialization: torch (torch's own: weights and "
                            "biases uniform in +-1/sqrt(fan_in) in every layer, the "
                            "released code's 'torch' init), small-policy (the same with "
                            "the policy head's weights x 0.01: a near-uniform first "
                            "policy; called default before) or orthogonal (gain sqrt(2) "
                            "in the torso, 0.01 on the policy head, 1 on the value head, "
                            "zero biases: SB3's and OpenAI baselines' A2C)",
                   choices=INITS + tuple(INIT_ALIASES))
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
        req("lr_anneal_steps", self.lr_anneal_steps >= 0, "must be >= 0 (0 = --total-steps)")
        req("rms_decay", 0 <= self.rms_decay < 1, "must be in [0, 1)")
        req("rms_eps", self.rms_eps > 0, "must be > 0")
        req("rms_style", self.rms_style in RMS_STYLES, f"must be one of {', '.join(RMS_STYLES)}")
        req("loss_scale", self.loss_scale > 0 and math.isfinite(self.loss_scale),
            "must be a finite number > 0")
        req("activation", self.activation in ACTIVATION_NAMES,
            f"must be one of {', '.join(ACTIVATION_NAMES)}")
        self.init = INIT_ALIASES.get(self.init, self.init)
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
        req("cnn", self.cnn in CNN_NAMES, f"must be one of {', '.join(CNN_NAMES)}")
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


class PAACSpec(AlgoSpec):
    """What the configuration layer reads of PAAC (`pal_hpc.algos.spec`)."""

    name = "paac"
    Config = PAACConfig
    on_policy = True
    # Evaluations are run by the master and hold up every node: less often than DQN's.
    run_defaults = {"eval_every": 10_000}
    # MinAtar ids (10x10 frames): the MinAtar paper's network.
    minatar_defaults = {"cnn": "minatar"}
    # Named sets of option values (config_from_dict applies the chosen one under the
    # flags a user gave): the field that chooses, and the sets.
    preset_field = "paac_preset"
    presets = PRESETS

    @classmethod
    def check_env(cls, env_id, obs_space, act_space) -> None:
        import gymnasium as gym

        cls.needs(gym.spaces.Discrete, env_id, act_space)

    @classmethod
    def rollout_steps(cls, config) -> int:
        """Environment steps per round (each environment) under `config` (every rank
        asks, the environment workers without importing torch)."""
        return int(config.t_max)
