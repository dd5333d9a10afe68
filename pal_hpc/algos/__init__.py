"""RL algorithms on the contract of `pal_hpc.algos.base`: the maths of each (networks,
losses, gradient steps, exploration), free of MPI and replay.

Two registries under the same --algo names: `pal_hpc.algos.registry.SPECS`, torch-free,
what the configuration layer reads (each algorithm's config dataclass and defaults,
`pal_hpc.algos.spec`), and `ALGOS` here, the algorithm classes, each derived from its
spec.  Everything here is imported on first use, so reading or refusing a config
never imports torch.  A new algorithm: its spec and a line in registry.py, its class
and a line in `_CLASSES`."""

import importlib

# --algo name -> the class's name in `_WHERE`.
_CLASSES = {"dqn": "DQN", "ddpg": "DDPG", "td3": "TD3", "sac": "SAC", "paac": "PAAC",
            "ppo": "PPO"}
_WHERE = {"AlgoConfig": "pal_hpc.algos.spec", "Algorithm": "pal_hpc.algos.base",
          "Policy": "pal_hpc.algos.acting", "DDPG": "pal_hpc.algos.ddpg",
          "DQN": "pal_hpc.algos.dqn", "QNetwork": "pal_hpc.algos.dqn",
          "PAAC": "pal_hpc.algos.paac.algorithm", "PPO": "pal_hpc.algos.ppo.algorithm",
          "SAC": "pal_hpc.algos.sac", "TD3": "pal_hpc.algos.td3"}

__all__ = ["ALGOS", *sorted(_WHERE)]


def __getattr__(name: str):
    if name == "ALGOS":
        from pal_hpc.algos.registry import SPECS

        algos = {key: __getattr__(cls) for key, cls in _CLASSES.items()}
        for key, Algo in algos.items():
            assert issubclass(Algo, SPECS[key]), f"{key}: {Algo.__name__} is not its spec's"
        globals()["ALGOS"] = algos
        return algos
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
