"""PPO's hyper-parameters (PPOConfig, its flags) and the defaults per env family.

The dataclass defaults are CleanRL's `ppo.py` (classic control: CartPole-v1).  Other
families take the values of CleanRL's script for them, for every field the user did not
set (`env_defaults`, applied by `pal_hpc.config_io.config_from_dict`):

- continuous actions (Box): `ppo_continuous_action.py` (MuJoCo: Hopper, HalfCheetah);
- Atari frames: `ppo_atari.py` (the Nature CNN, shared torso, life loss terminal).

`--ppo-preset zoo` takes rl-baselines3-zoo's `hyperparams/ppo.yml` instead (its tuned
entries for CartPole-v1, Hopper, HalfCheetah and Atari; SB3's PPO defaults for other
ids).  SB3's value loss is mean((R - V)^2) without CleanRL's factor 0.5, so a zoo vf_coef
c is our 2c; zoo's `lin_x` is x annealed linearly to 0; SB3 clips no value unless asked.
docs/ppo.md lists each value with its source.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from pal_hpc.algos.spec import ACTIVATION_NAMES, CNN_NAMES, PRECISIONS, AlgoConfig, AlgoSpec
from pal_hpc.options import ConfigError
from pal_hpc.options import option as _f

PRESETS = ("cleanrl", "zoo")
INITS = ("orthogonal", "torch")
CLIP_CHOICES = ("auto", "on", "off")

# CleanRL's ppo_continuous_action.py and ppo_atari.py, where they differ from ppo.py.
CLEANRL_CONTINUOUS = {"num_envs": 1, "num_steps": 2048, "num_minibatches": 32,
                      "update_epochs": 10, "lr": 3e-4, "ent_coef": 0.0,
                      "norm_obs": True, "norm_reward": True}
CLEANRL_ATARI = {"num_envs": 8, "num_steps": 128, "num_minibatches": 4, "update_epochs": 4,
                 "lr": 2.5e-4, "clip_coef": 0.1, "ent_coef": 0.01, "shared_torso": True,
                 "cnn": "nature"}
# rl-baselines3-zoo's ppo.yml.  SB3's defaults first (what an entry does not set), then
# the tuned entries; num_minibatches = n_steps * n_envs / batch_size.
SB3 = {"num_envs": 1, "num_steps": 2048, "num_minibatches": 32, "update_epochs": 10,
       "lr": 3e-4, "lr_anneal": False, "gae_lambda": 0.95, "clip_coef": 0.2,
       "clip_vloss": False, "ent_coef": 0.0, "vf_coef": 1.0, "max_grad_norm": 0.5}
ZOO_MUJOCO_NET = {"log_std_init": -2.0, "init": "torch", "activation": "relu",
                  "hidden": [256, 256], "norm_obs": True, "norm_reward": True}
ZOO = {
    "CartPole-v1": {"num_envs": 8, "num_steps": 32, "num_minibatches": 1,
                    "update_epochs": 20, "gae_lambda": 0.8, "gamma": 0.98, "ent_coef": 0.0,
                    "lr": 1e-3, "lr_anneal": True, "clip_coef": 0.2, "clip_anneal": True},
    "Hopper": {**ZOO_MUJOCO_NET, "num_envs": 1, "num_steps": 512, "num_minibatches": 16,
               "gamma": 0.999, "lr": 9.80828e-05, "ent_coef": 0.00229519, "clip_coef": 0.2,
               "update_epochs": 5, "gae_lambda": 0.99, "max_grad_norm": 0.7,
               "vf_coef": 2 * 0.835671},
    "HalfCheetah": {**ZOO_MUJOCO_NET, "num_envs": 1, "num_steps": 512, "num_minibatches": 8,
                    "gamma": 0.98, "lr": 2.0633e-05, "ent_coef": 0.000401762,
                    "clip_coef": 0.1, "update_epochs": 20, "gae_lambda": 0.92,
                    "max_grad_norm": 0.8, "vf_coef": 2 * 0.58096},
    "atari": {"num_envs": 8, "num_steps": 128, "num_minibatches": 4, "update_epochs": 4,
              "lr": 2.5e-4, "lr_anneal": True, "clip_coef": 0.1, "clip_anneal": True,
              "vf_coef": 1.0, "ent_coef": 0.01, "shared_torso": True, "cnn": "nature"},
}
# Run-wide fields the families set (Config's, not PPOConfig's).
RUN_FIELDS = ("gamma", "atari_terminal_on_life_loss")


@functools.cache
def env_family(env_id: str) -> str:
    """"atari" (frames), "continuous" (a Box action space) or "discrete"."""
    import gymnasium as gym

    from pal_hpc.envs.make import is_atari

    if is_atari(env_id):
        return "atari"
    try:
        env = gym.make(env_id)
    except Exception:             # an unknown id (Config.validate names it), or one whose
        try:                      # engine is missing here: MuJoCo's are continuous
            entry = str(gym.spec(env_id).entry_point)
        except Exception:
            return "discrete"
        return "continuous" if "mujoco" in entry else "discrete"
    try:
        return "continuous" if isinstance(env.action_space, gym.spaces.Box) else "discrete"
    finally:
        env.close()


def env_defaults(env_id: str, preset: str) -> dict:
    """The values of `preset` (cleanrl, zoo) for `env_id`'s family: PPOConfig fields
    and run-wide ones (RUN_FIELDS); the user's flags win over them."""
    family = env_family(env_id)
    if preset == "zoo":
        base = env_id.split("-")[0]
        entry = ZOO.get(env_id) or ZOO.get(base) or ZOO.get(family if family == "atari"
                                                             else "", {})
        out = {**SB3, **entry}
        if family == "continuous" and not entry:
            out.setdefault("norm_obs", True)
            out.setdefault("norm_reward", True)
    else:
        out = {"continuous": CLEANRL_CONTINUOUS, "atari": CLEANRL_ATARI}.get(family, {})
        out = dict(out)
    if family == "atari":
        out["atari_terminal_on_life_loss"] = True     # both: EpisodicLifeEnv / AtariWrapper
    return out


@dataclass
class PPOConfig(AlgoConfig):
    """PPO's hyper-parameters; defaults: CleanRL's ppo.py (others per env family)."""

    ppo_preset: str = _f("cleanrl", "cleanrl = CleanRL's script for the env's family "
                                    "(ppo.py, ppo_continuous_action.py, ppo_atari.py); "
                                    "zoo = rl-baselines3-zoo's ppo.yml.  A flag given "
                                    "for a field wins over the preset", choices=PRESETS)
    num_envs: int = _f(4, "environments per node, stepped in lockstep (a multiple of the "
                          "node's worker ranks when they step them)")
    num_steps: int = _f(128, "environment steps per round: each update learns from "
                             "num_steps steps of every environment of every node")
    num_minibatches: int = _f(4, "minibatches each epoch splits the round's batch (of all "
                                 "nodes) into; each minibatch is one gradient Allreduce")
    update_epochs: int = _f(4, "epochs over the round's batch, reshuffled each epoch")
    lr: float = _f(2.5e-4, "Adam learning rate at the start")
    lr_anneal: bool = _f(True, "anneal the learning rate linearly to 0 over --total-steps")
    adam_eps: float = _f(1e-5, "Adam epsilon")
    gae_lambda: float = _f(0.95, "lambda of generalized advantage estimation, in [0, 1]")
    norm_adv: bool = _f(True, "normalize the advantages of each minibatch (its mean and "
                              "std over every master's rows)")
    clip_coef: float = _f(0.2, "the surrogate's clip range epsilon (and the value clip's)")
    clip_anneal: bool = _f(False, "anneal clip_coef linearly to 0 with the learning rate "
                                  "(the zoo's lin_ clip ranges)")
    clip_vloss: bool = _f(True, "clip the value loss around the round's old values")
    ent_coef: float = _f(0.01, "entropy bonus coefficient")
    vf_coef: float = _f(0.5, "value loss coefficient (the value loss is "
                             "0.5 mean((V - R)^2))")
    max_grad_norm: float = _f(0.5, "clip each minibatch's gradient to this global norm "
                                   "(0 = no clip)")
    target_kl: float | None = _f(None, "stop the round's epochs once the approx KL of an "
                                       "epoch's last minibatch exceeds this (CleanRL's "
                                       "rule; none = never)")
    norm_obs: bool = _f(False, "normalize observations by running mean/variance (merged "
                               "across masters each round), clipped to +-norm_clip")
    norm_reward: bool = _f(False, "scale rewards by the running std of the discounted "
                                  "return (merged across masters), clipped to +-norm_clip")
    norm_clip: float = _f(10.0, "clip of normalized observations and rewards")
    clip_rewards: str = _f("auto", "rewards to their sign for learning: auto = on frames "
                                   "(Atari) only", choices=CLIP_CHOICES)
    hidden: list[int] = _f([64, 64], "widths of the MLP torso(s) on vectors")
    activation: str = _f("tanh", "activation of the MLP torso(s)",
                         choices=ACTIVATION_NAMES)
    shared_torso: bool = _f(False, "one torso for policy and value (the CNN's default: "
                                   "the Atari family sets it); else one each")
    cnn: str = _f("nature", "CNN torso on frames: nature, nips or minatar (MinAtar ids' "
                            "default)", choices=CNN_NAMES)
    init: str = _f("orthogonal", "orthogonal: gain sqrt(2), biases 0, policy head 0.01, "
                                 "value head 1; torch: torch's own", choices=INITS)
    log_std_init: float = _f(0.0, "continuous actions: the initial log std of the "
                                  "Gaussian (a state-independent parameter)")
    precision: str = _f("fp32", "arithmetic of the master's torso when it runs through "
                                "torch (frames, shared torsos, GPUs): fp32, or bf16 "
                                "(torch.autocast to bfloat16 for acting and the update's "
                                "forward and backward; the heads, log-probabilities, "
                                "losses, parameters, Adam and the Allreduce stay fp32; "
                                "about 2.5x faster Nature CNN updates on CPUs with "
                                "AVX512-BF16 or AMX, 7x slower on those without)",
                        choices=PRECISIONS)

    def validate(self) -> None:
        super().validate()
        req = self.require
        req("ppo_preset", self.ppo_preset in PRESETS, f"must be one of {', '.join(PRESETS)}")
        for name in ("num_envs", "num_steps", "num_minibatches", "update_epochs"):
            req(name, getattr(self, name) >= 1, "must be >= 1")
        req("lr", self.lr > 0, "must be > 0")
        req("adam_eps", self.adam_eps > 0, "must be > 0")
        req("gae_lambda", 0 <= self.gae_lambda <= 1, "must be in [0, 1]")
        req("clip_coef", self.clip_coef > 0, "must be > 0")
        for name in ("ent_coef", "vf_coef", "max_grad_norm"):
            req(name, getattr(self, name) >= 0, "must be >= 0")
        req("target_kl", self.target_kl is None or self.target_kl > 0, "must be > 0 or none")
        req("norm_clip", self.norm_clip > 0, "must be > 0")
        req("clip_rewards", self.clip_rewards in CLIP_CHOICES,
            f"must be one of {', '.join(CLIP_CHOICES)}")
        req("hidden", len(self.hidden) >= 1 and all(h >= 1 for h in self.hidden),
            "must be a non-empty list of positive widths")
        req("activation", self.activation in ACTIVATION_NAMES,
            f"must be one of {', '.join(ACTIVATION_NAMES)}")
        req("cnn", self.cnn in CNN_NAMES, f"must be one of {', '.join(CNN_NAMES)}")
        req("init", self.init in INITS, f"must be one of {', '.join(INITS)}")
        req("precision", self.precision in PRECISIONS,
            f"must be one of {', '.join(PRECISIONS)}")


class PPOSpec(AlgoSpec):
    """What the configuration layer reads of PPO (`pal_hpc.algos.spec`)."""

    name = "ppo"
    Config = PPOConfig
    on_policy = True
    run_defaults = {"eval_every": 10_000}
    # MinAtar ids (10x10 frames): the MinAtar paper's network.
    minatar_defaults = {"cnn": "minatar"}
    preset_field = "ppo_preset"
    presets = {name: {} for name in PRESETS}     # values per env: env_defaults
    env_defaults = staticmethod(env_defaults)

    @classmethod
    def check_env(cls, env_id, obs_space, act_space) -> None:
        import gymnasium as gym

        if not isinstance(act_space, (gym.spaces.Discrete, gym.spaces.Box)):
            raise ConfigError(f"env: ppo needs a Discrete or Box action space; {env_id} "
                              f"has {act_space}")

    @classmethod
    def rollout_steps(cls, config) -> int:
        return int(config.num_steps)
