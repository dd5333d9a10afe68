"""RL algorithms: the maths of each (networks, losses, gradient steps), free of MPI and replay."""

from pal_hpc.algos.dqn import DQN, QNetwork

ALGOS = {"dqn": DQN}

__all__ = ["ALGOS", "DQN", "QNetwork"]
