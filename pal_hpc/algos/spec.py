"""The torch-free half of every algorithm: the base of its hyper-parameters
(`AlgoConfig`) and of its spec (`AlgoSpec`: what the configuration layer reads off the
algorithm -- its name, Config, run-wide defaults, presets, whether it runs on-policy).

`--help`, reading and validating a config, and refusing a bad flag need only these;
the algorithm's class (networks, losses: torch, about 1.7 s of CPU per rank to import)
is imported once a run is about to start.  Each algorithm's class derives from its
spec (`class DQN(DQNSpec, OnePhaseAlgorithm)`), so the two never disagree.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import sys
from typing import Any, ClassVar

from pal_hpc.options import ConfigError, option

PRECISIONS = ("fp32", "bf16")
# The names the torch side maps to layers (`nets.ACTIVATIONS`, `cnn.KINDS`).
ACTIVATION_NAMES = ("relu", "tanh")
CNN_NAMES = ("nature", "nips", "minatar")
# Each CNN torso's (out_channels, kernel, stride) per conv layer and its dense width
# (`cnn.CNNTorso` builds them; `acting.MinAtarQValues` acts on MINATAR in numpy).
NATURE = ((32, 8, 4), (64, 4, 2), (64, 3, 1)), 512    # Mnih et al. 2015
NIPS = ((16, 8, 4), (32, 4, 2)), 256                  # Mnih et al. 2013; PAAC (Clemente 2017)
MINATAR = ((16, 3, 1),), 128                          # Young & Tian 2019, on 10x10 frames


def conv_out(size: int, layers) -> int:
    """Side length after unpadded convolutions: floor((size - kernel) / stride) + 1 each."""
    for _, kernel, stride in layers:
        size = (size - kernel) // stride + 1
    return size


class AlgoConfig:
    """Base of an algorithm's hyper-parameters.  Each field needs `help` metadata
    (use `pal_hpc.options.option`); `validate` raises ConfigError naming the field."""

    def validate(self) -> None:
        """Every float field must be finite; subclasses add their own checks."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{f.name}: must be finite, got {value!r}")

    def require(self, name: str, ok: bool, what: str) -> None:
        """Raise `ConfigError("<name>: <what>, got <value>")` unless `ok`."""
        if not ok:
            raise ConfigError(f"{name}: {what}, got {getattr(self, name)!r}")


def precision_option() -> str:
    """The `precision` field of the off-policy algorithms' configs (DQN, DDPG, TD3, SAC)."""
    return option("fp32", "arithmetic of the learner's forward and backward passes: fp32, "
                          "or bf16 (torch.autocast to bfloat16: matrix products and "
                          "convolutions in bf16; the parameters, gradients, optimizer and "
                          "Allreduce stay fp32)", choices=PRECISIONS)


class AlgoSpec:
    """What the configuration layer knows of an algorithm (`pal_hpc.config_io`).

    - `name`, `Config`: the --algo name and its hyper-parameters' dataclass;
    - `run_defaults`: run-wide defaults it wants where the user gave none (TD3's gamma
      0.98 and batches of 256);
    - `atari_run_defaults`, `atari_defaults`: run-wide and own defaults for Atari ids;
      `minatar_defaults`: own defaults for MinAtar ids (DQN's run-wide ones come
      with its --minatar-preset, `env_defaults`);
    - `preset_field`, `presets`: the option naming a preset, and each preset's values;
      `env_defaults(env, preset)`: a preset's values for an env's family (PPO);
    - `on_policy`: runs on the lockstep runtime (one master per node), not on actors,
      replay and learners;
    - `metric_names`: the learner metrics the log records;
    - `check_env`, `signature_of` and `numpy_policy`: what the runtime asks of an
      algorithm before (or instead of) building it -- whether it takes an env's
      spaces, what a checkpoint must match, and a torch-free policy where it has one
      (an actor rank that is not a learner then never imports torch)."""

    name: ClassVar[str]
    Config: ClassVar[type]
    run_defaults: ClassVar[dict] = {}
    atari_run_defaults: ClassVar[dict] = {}
    atari_defaults: ClassVar[dict] = {}
    minatar_defaults: ClassVar[dict] = {}
    preset_field: ClassVar[str | None] = None
    presets: ClassVar[dict[str, dict[str, Any]]] = {}
    env_defaults: ClassVar[Any] = None
    on_policy: ClassVar[bool] = False
    metric_names: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def check_env(cls, env_id: str, obs_space, act_space) -> None:
        """Raise ConfigError (field "env") when the spaces do not fit the algorithm."""

    @classmethod
    def needs(cls, kind: type, env_id: str, act_space) -> None:
        """check_env's usual body: the action space must be a `kind`."""
        if not isinstance(act_space, kind):
            raise ConfigError(f"env: {cls.name} needs a {kind.__name__} action space; "
                              f"{env_id} has {act_space}")

    @classmethod
    def signature_of(cls, obs_space, act_space, config) -> dict:
        """What a checkpoint must match to be resumed into this algorithm: its name,
        the spaces and every config field that changes a shape."""
        return {"algo": cls.name, "obs_shape": list(obs_space.shape),
                "action_space": str(act_space)}

    @classmethod
    def numpy_policy(cls, obs_space, act_space, config, actor_index: int, n_actors: int):
        """A `pal_hpc.algos.acting.Policy` for actor `actor_index` of `n_actors` that
        needs no torch, where the algorithm has one for these spaces (its parameters
        still to be loaded), else None.  An actor rank that is not also a learner then
        never imports torch: 2.6 CPU-s and ~160 MB less a rank on a 2-core EPYC."""
        return None


def is_image(obs_space) -> bool:
    """Frames: a 3-D uint8 Box, channels first (Atari's stacked (4, 84, 84))."""
    import gymnasium as gym
    import numpy as np

    return (isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 3
            and obs_space.dtype == np.uint8)


def lazy_exports(package: str, where: dict[str, str]):
    """A module `__getattr__` for `package` (PEP 562): each name of `where` is imported
    from its submodule (`where[name]`, relative to the package) on first use, and kept.
    The algorithm packages use it so that importing their config never imports torch."""
    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value
    return __getattr__
