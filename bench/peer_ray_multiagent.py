"""The Ray side of bench/bench_multiagent.py: multi-agent inference built the way the
reactor-model paper's Ray baseline is (arXiv 2312.04704; its code: github
jackyk02/parallel_rl_benchmarks): one `@ray.remote` actor per agent holding that agent's
policy, and each env step one remote call per live agent with its observation, a
`ray.get` barrier on all of them, then `env.step` on the driver.  Runs in .venv-peers
(Ray lives there, never in .venv); the env and the policies are bench/ma_setup.py's,
the same code as our side's.

    .venv-peers/bin/python bench/peer_ray_multiagent.py --agents 10 --steps 20000

Prints one JSON line: steps, episodes, the seconds from the first step's calls to the
last step's end (actors constructed and answering before) and the start-up seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import ray

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ma_setup import battle, policy_makers  # noqa: E402


@ray.remote
class AgentActor:
    """One agent's policy."""

    def __init__(self, maker):
        self.policy = maker()

    def ready(self) -> bool:
        return True

    def act(self, obs) -> int:
        return self.policy(obs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--max-cycles", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t_init = time.monotonic()
    ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False,
             log_to_driver=False, logging_level="ERROR")
    env = battle(args.agents, args.max_cycles)
    # num_cpus=0: the paper's one actor per agent even where agents outnumber cores.
    actors = {a: AgentActor.options(num_cpus=0).remote(m)
              for a, m in policy_makers(env, args.seed).items()}
    ray.get([a.ready.remote() for a in actors.values()])
    setup_s = time.monotonic() - t_init
    obs, _ = env.reset(seed=args.seed)
    episodes, t0 = 1, time.perf_counter()
    for _ in range(args.steps):
        if not env.agents:
            obs, _ = env.reset()
            episodes += 1
        live = env.agents
        acts = ray.get([actors[a].act.remote(obs[a]) for a in live])
        obs, _, _, _, _ = env.step(dict(zip(live, acts)))
    wall = time.perf_counter() - t0
    ray.shutdown()
    print(json.dumps({"steps": args.steps, "episodes": episodes, "seconds": wall,
                      "setup_s": setup_s, "agents": args.agents}), flush=True)


if __name__ == "__main__":
    main()
