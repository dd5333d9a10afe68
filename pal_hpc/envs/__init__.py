"""Environments: `make_env` (gymnasium ids, Atari preprocessing, MinAtar's games as
frames), the lockstep vector env, and multi-agent lockstep inference beside a PettingZoo
env (`LockstepAgents`)."""

from pal_hpc.envs.lockstep import LockstepError, LockstepVectorEnv
from pal_hpc.envs.lockstep_agents import LockstepAgents
from pal_hpc.envs.make import action_info, is_atari, is_minatar, make_env, obs_info

__all__ = ["make_env", "action_info", "obs_info", "is_atari", "is_minatar", "LockstepVectorEnv",
           "LockstepError", "LockstepAgents"]
