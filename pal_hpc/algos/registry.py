"""The algorithms by --algo name, without torch: each one's spec (`pal_hpc.algos.spec`),
which the configuration layer reads.  `pal_hpc.algos.ALGOS` maps the same names to
the algorithm classes (torch), each derived from its spec here.

A new algorithm is its spec (config dataclass and defaults, in a torch-free module)
and one line here, then its class and one line in `pal_hpc.algos`."""

from __future__ import annotations

from pal_hpc.algos.configs import DDPGSpec, DQNSpec, SACSpec, TD3Spec
from pal_hpc.algos.paac.config import PAACSpec
from pal_hpc.algos.ppo.config import PPOSpec
from pal_hpc.algos.spec import AlgoSpec

SPECS: dict[str, type[AlgoSpec]] = {"dqn": DQNSpec, "ddpg": DDPGSpec, "td3": TD3Spec,
                                    "sac": SACSpec, "paac": PAACSpec, "ppo": PPOSpec}
