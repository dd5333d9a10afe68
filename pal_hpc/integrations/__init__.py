"""pal_hpc's K-ary prioritized replay as a plug-in for other RL frameworks.

`pal_hpc.integrations.sb3` (Stable-Baselines3: a PrioritizedReplayBuffer and the DQN,
SAC and TD3 that use it) and `pal_hpc.integrations.torchrl` (a torchrl Sampler) each
import their framework, installed with `pip install .[sb3]` / `.[torchrl]`; this
package imports neither, and nothing else in pal_hpc imports this package.
"""
