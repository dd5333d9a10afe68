"""PAAC (Clemente, Castejon, Chandra 2017, arXiv 1705.04862): synchronous advantage
actor-critic on a batch of environments stepped in lockstep, on the algorithm contract
(`pal_hpc.algos.base`).  On-policy: no replay, one update phase ("ac"); the runtime
that drives it is `pal_hpc.runtime.onpolicy`.

The modules, each importing only those above it in this list:
- `config`: the hyper-parameters (PAACConfig: the paper's and its released code's
  values), the presets (--paac-preset), resolve_num_envs.
- `network`: the actor-critic network (ActorCritic), sample_actions, PAACPolicy.
- `loss`: the round's rollout layout, nstep_returns and the advantage actor-critic loss
  (actor_critic_loss); its docstring holds the equations.
- `algorithm`: PAAC, the class the registry names: the flat parameters, RMSProp, the
  learning-rate schedule, gradients, checkpoints.
"""

from pal_hpc.algos.paac.algorithm import PAAC
from pal_hpc.algos.paac.config import (CLIP_CHOICES, INITS, NUM_ENVS, PRECISIONS, PRESETS,
                                       RMS_STYLES, PAACConfig, resolve_num_envs)
from pal_hpc.algos.paac.loss import BATCH_KEYS, actor_critic_loss, check_batch, nstep_returns
from pal_hpc.algos.paac.network import ActorCritic, PAACPolicy, sample_actions

__all__ = ["BATCH_KEYS", "CLIP_CHOICES", "INITS", "NUM_ENVS", "PAAC", "PAACConfig",
           "PAACPolicy", "PRECISIONS", "PRESETS", "RMS_STYLES", "ActorCritic",
           "actor_critic_loss", "check_batch", "nstep_returns", "resolve_num_envs",
           "sample_actions"]
