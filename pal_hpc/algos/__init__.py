"""RL algorithms on the contract of `pal_hpc.algos.base`: the maths of each (networks,
losses, gradient steps, exploration), free of MPI and replay.

The registry: a new algorithm is one module and one line here."""

from pal_hpc.algos.base import Algorithm, AlgoConfig, Policy
from pal_hpc.algos.ddpg import DDPG
from pal_hpc.algos.dqn import DQN, QNetwork
from pal_hpc.algos.paac import PAAC
from pal_hpc.algos.ppo import PPO
from pal_hpc.algos.sac import SAC
from pal_hpc.algos.td3 import TD3

ALGOS: dict[str, type[Algorithm]] = {"dqn": DQN, "ddpg": DDPG, "td3": TD3, "sac": SAC, "paac": PAAC,
                               "ppo": PPO}

__all__ = ["ALGOS", "AlgoConfig", "Algorithm", "DDPG", "DQN", "PAAC", "PPO", "Policy", "QNetwork", "SAC", "TD3"]
