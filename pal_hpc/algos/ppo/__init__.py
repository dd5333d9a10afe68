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

from pal_hpc.algos.ppo.algorithm import PPO
from pal_hpc.algos.ppo.config import PPOConfig, env_defaults
from pal_hpc.algos.ppo.loss import SUMS, explained_variance, gae, ppo_loss
from pal_hpc.algos.ppo.network import PPONet, PPOPolicy
from pal_hpc.algos.ppo.normalize import RunningMoments, moments

__all__ = ["PPO", "PPOConfig", "PPONet", "PPOPolicy", "RunningMoments", "SUMS",
           "env_defaults", "explained_variance", "gae", "moments", "ppo_loss"]
