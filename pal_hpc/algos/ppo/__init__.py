"""PPO (Schulman et al. 2017, arXiv 1707.06347), the core details of "The 37
Implementation Details of PPO" (Huang et al. 2022) as CleanRL's scripts implement them,
on the on-policy contract (`pal_hpc.algos.onpolicy`): the lockstep runtime
(`pal_hpc.runtime.onpolicy`) drives it beside PAAC.

The modules, each importing only those above it in this list:
- `config`: the hyper-parameters (PPOConfig), the defaults per env family (CleanRL's
  scripts) and --ppo-preset zoo (rl-baselines3-zoo's), `env_defaults`;
- `normalize`: running observation / return statistics merged across masters;
- `network`: the actor-critic (PPONet: categorical or Gaussian), sampling, PPOPolicy;
- `loss`: GAE and the clipped surrogate (its docstring holds the equations);
- `numpy_grad`: that loss's gradient by hand for small MLPs on the CPU;
- `algorithm`: PPO, the class the registry names.
"""

from pal_hpc.algos.spec import lazy_exports

# Each name -> its module, imported on first use (`config` alone needs no torch).
_WHERE = {"PPO": "algorithm",
          "PPOConfig": "config",
          "PPOSpec": "config",
          "env_defaults": "config",
          "SUMS": "loss",
          "explained_variance": "loss",
          "gae": "loss",
          "ppo_loss": "loss",
          "PPONet": "network",
          "PPOPolicy": "network",
          "RunningMoments": "normalize",
          "moments": "normalize"}

__all__ = sorted(_WHERE)

__getattr__ = lazy_exports(__name__, _WHERE)
