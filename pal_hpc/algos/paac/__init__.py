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
- `numpy_grad`: that loss's gradient by hand for small MLPs on the CPU (NumpyGrad).
- `algorithm`: PAAC, the class the registry names: the flat parameters, RMSProp, the
  learning-rate schedule, gradients, checkpoints.
"""

from pal_hpc.algos.spec import lazy_exports

# Each name -> its module, imported on first use (`config` alone needs no torch).
_WHERE = {"PAAC": "algorithm",
          "CLIP_CHOICES": "config",
          "INITS": "config",
          "NUM_ENVS": "config",
          "PRECISIONS": "config",
          "PRESETS": "config",
          "RMS_STYLES": "config",
          "PAACConfig": "config",
          "PAACSpec": "config",
          "resolve_num_envs": "config",
          "BATCH_KEYS": "loss",
          "actor_critic_loss": "loss",
          "check_batch": "loss",
          "nstep_returns": "loss",
          "ActorCritic": "network",
          "PAACPolicy": "network",
          "sample_actions": "network"}

__all__ = sorted(_WHERE)

__getattr__ = lazy_exports(__name__, _WHERE)
