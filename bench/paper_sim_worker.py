"""One row of the reactor paper's simulation-throughput benchmark (arXiv 2312.04704,
section "Gym/Atari environments"), in its own process; prints one JSON line.

The paper's setup, as its published benchmark has it (jackyk02/parallel_rl_benchmarks,
3.Gym_Environments/*_ray.py, 4.Atari_Environments/*_ray.py): 15 environments, one step
of all 15 per round with random actions, and the time of the rounds after the first.
Its Ray side is one `@ray.remote` actor per environment that draws its own random action,
steps, resets on an episode end and returns the whole step result; the driver calls all
15 and waits with one `ray.get` per round.  Its Atari envs are plain `gym.make` ones: raw
210x160x3 RGB frames.

    lockstep  pal_hpc.envs.LockstepVectorEnv(15 envs, num_workers=W), copy=True, random
              actions drawn up front (project venv)
    ray       the paper's baseline as above (peer venv: .venv-peers)
    plain     one env in this process, a bare step/reset loop with random actions: what
              one core can step, so min(cores, 15) x plain bounds every engine here

Envs: cartpole, blackjack, pendulum (CartPole-v1, Blackjack-v1 -- a Tuple observation --,
Pendulum-v1: the paper's Pendulum-v0 is gone from gymnasium); pong, mspacman,
spaceinvaders raw (`gym.make("ALE/<Game>-v5")`, RGB frames) and the same with `-pre`
(preprocessed as pal_hpc.envs.make_env does: frameskip 4 max-pooled, 30 no-ops, 84x84
gray, 4 stacked).

    python bench/paper_sim_worker.py --engine lockstep --env blackjack --workers 2
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")

from vecenv_worker import timed  # noqa: E402  (bench/ is the script's directory)

GYM = {"cartpole": "CartPole-v1", "blackjack": "Blackjack-v1", "pendulum": "Pendulum-v1"}
ATARI = {"pong": "Pong", "mspacman": "MsPacman", "spaceinvaders": "SpaceInvaders"}
ENVS = list(GYM) + list(ATARI) + [f"{g}-pre" for g in ATARI]


def maker(name: str):
    """A zero-argument constructor of env `name` (one of ENVS)."""
    def make():
        import gymnasium as gym
        if name in GYM:
            return gym.make(GYM[name])
        import ale_py
        gym.register_envs(ale_py)
        game = ATARI[name.removesuffix("-pre")]
        if not name.endswith("-pre"):
            return gym.make(f"ALE/{game}-v5")               # raw RGB, as the paper
        env = gym.make(f"ALE/{game}-v5", frameskip=1)
        env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84,
                                              grayscale_obs=True, scale_obs=False)
        return gym.wrappers.FrameStackObservation(env, 4)
    return make


def draw(space, rng: np.random.Generator, size: tuple) -> np.ndarray:
    """Random actions of `space` (Discrete or Box), `size` leading dims."""
    if hasattr(space, "n"):
        return rng.integers(0, space.n, size)
    return rng.uniform(space.low, space.high, size + space.shape).astype(space.dtype)


def run(args) -> dict:
    n, make = args.num_envs, maker(args.env)
    probe = make()
    space = probe.action_space
    probe.close()
    if args.engine == "lockstep":
        from pal_hpc.envs.lockstep import LockstepVectorEnv
        env = LockstepVectorEnv([make] * n, args.workers)
        env.reset(seed=0)
        actions = draw(space, np.random.default_rng(0), (4096, n))
        rate = timed(env.step, n, actions, args.seconds, args.warmup)
        env.close()
    elif args.engine == "ray":
        import ray
        ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False,
                 log_to_driver=False, logging_level="ERROR")

        @ray.remote
        class RolloutWorker:
            """One env; draws its own random action each step, as the paper's does."""

            def __init__(self, seed: int):
                self.env, self.rng = make(), np.random.default_rng(seed)
                self.env.reset(seed=seed)

            def step(self, _round: int):
                a = draw(self.env.action_space, self.rng, ())
                result = self.env.step(int(a) if a.ndim == 0 else a)
                if result[2] or result[3]:
                    self.env.reset()
                return result

        workers = [RolloutWorker.remote(i) for i in range(n)]
        ray.get([w.step.remote(0) for w in workers])      # every actor up: round 0 untimed
        rounds = np.arange(4096).reshape(-1, 1)
        rate = timed(lambda k: ray.get([w.step.remote(int(k[0])) for w in workers]), n,
                     rounds, args.seconds, args.warmup)
        ray.shutdown()
    elif args.engine == "plain":
        env = make()
        env.reset(seed=0)
        actions = draw(space, np.random.default_rng(0), (4096, 1))

        def step(a):
            result = env.step(int(a[0]) if a[0].ndim == 0 else a[0])
            if result[2] or result[3]:
                env.reset()

        n = 1
        rate = timed(step, 1, actions, args.seconds, args.warmup)
        env.close()
    else:
        raise SystemExit(f"--engine: unknown {args.engine!r}")
    return {"engine": args.engine, "env": args.env, "workers": args.workers,
            "num_envs": n, "steps_per_s": rate}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=["lockstep", "ray", "plain"], required=True)
    p.add_argument("--env", choices=ENVS, required=True)
    p.add_argument("--workers", type=int, default=2, help="LockstepVectorEnv workers")
    p.add_argument("--num-envs", type=int, default=15)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--warmup", type=float, default=0.5)
    print(json.dumps(run(p.parse_args())), flush=True)
    os._exit(0)                   # skip slow interpreter teardown of Ray and friends


if __name__ == "__main__":
    main()
