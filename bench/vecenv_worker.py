"""One vector-env throughput measurement, in its own process; prints one JSON line.

Runs in the project venv (engines lockstep, async, sync, plain) or in the peer venv
(ray, envpool, ale); see bench/bench_lockstep.py for what each engine is.  Every engine
steps random actions drawn up front (the same stream for all), with next-step or
same-step autoreset as the engine has it; a step of E environments counts E env steps.

    python bench/vecenv_worker.py --engine lockstep --env pong --workers 2 --per-worker 8
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")


def make_cartpole():
    import gymnasium as gym
    return gym.make("CartPole-v1")


def make_pong():
    """ALE/Pong-v5 preprocessed as pal_hpc.envs.make_env does it: frameskip 4 with the
    last two frames max-pooled, up to 30 no-ops, 84x84 grayscale uint8, 4 stacked."""
    import ale_py
    import gymnasium as gym
    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", frameskip=1)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84,
                                          grayscale_obs=True, scale_obs=False)
    return gym.wrappers.FrameStackObservation(env, 4)


MAKERS = {"cartpole": make_cartpole, "pong": make_pong}
N_ACTIONS = {"cartpole": 2, "pong": 6}


def timed(step, n_envs: int, actions: np.ndarray, seconds: float, warmup: float) -> float:
    """Env steps per second of `step(actions[k])` over `seconds`, after `warmup`."""
    k, rounds = 0, len(actions)
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        step(actions[k % rounds])
        k += 1
    done, t0 = 0, time.perf_counter()
    while True:
        for _ in range(8):
            step(actions[k % rounds])
            k += 1
        done += 8
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return done * n_envs / dt


def run(args) -> dict:
    n = args.workers * args.per_worker
    rng = np.random.default_rng(0)
    actions = rng.integers(0, N_ACTIONS[args.env], (4096, n))
    make = MAKERS[args.env]
    extra = {}

    if args.engine == "plain":                         # one env, one process, no vector env
        env = make()
        env.reset(seed=0)
        n = 1

        def step(a):
            _, _, te, tr, _ = env.step(int(a[0]))
            if te or tr:
                env.reset()
        actions = actions[:, :1]
    elif args.engine in ("lockstep", "async", "sync"):
        import gymnasium as gym
        if args.engine == "lockstep":
            from pal_hpc.envs.lockstep import LockstepVectorEnv
            env = LockstepVectorEnv([make] * n, args.workers)
            lay = env._views.layout
            def leaf_bytes(leaves):
                return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(d).itemsize
                           for shape, d in leaves)
            obs_b, act_b = leaf_bytes(lay.obs_leaves), leaf_bytes(lay.act_leaves)
            # per env step: obs written once into the shared batch and copied once out
            # of it (copy=True), the action copied in, reward + 2 flags written and copied
            extra["bytes_copied_per_step"] = 2 * obs_b + act_b + 2 * 10
        elif args.engine == "async":
            env = gym.vector.AsyncVectorEnv([make] * n, shared_memory=True)
        else:
            env = gym.vector.SyncVectorEnv([make] * n)
        env.reset(seed=0)
        step = env.step
    elif args.engine == "ray":                         # the reactor paper's baseline
        import ray
        ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False,
                 log_to_driver=False, logging_level="ERROR")

        @ray.remote
        class EnvActor:
            def __init__(self, seed):
                self.env = MAKERS[args.env]()
                self.env.reset(seed=seed)

            def step(self, a):
                obs, r, te, tr, _ = self.env.step(int(a))
                if te or tr:
                    obs, _ = self.env.reset()
                return obs, r, te, tr

        actors = [EnvActor.remote(i) for i in range(n)]
        ray.get([a.step.remote(0) for a in actors])    # wait until every actor is up

        def step(a):
            return ray.get([actor.step.remote(a[i]) for i, actor in enumerate(actors)])
    elif args.engine == "envpool":
        import envpool
        name = "CartPole-v1" if args.env == "cartpole" else "Pong-v5"
        kw = dict(repeat_action_probability=0.25, noop_max=30) if args.env == "pong" else {}
        env = envpool.make(name, env_type="gymnasium", num_envs=n, num_threads=args.workers,
                           seed=0, **kw)
        env.reset()
        step = env.step
    elif args.engine == "ale":
        from ale_py.vector_env import AtariVectorEnv
        env = AtariVectorEnv(game="pong", num_envs=n, num_threads=args.workers,
                             frameskip=4, noop_max=30, img_height=84, img_width=84,
                             stack_num=4, grayscale=True, repeat_action_probability=0.25)
        env.reset(seed=0)
        step = env.step
    else:
        raise SystemExit(f"--engine: unknown {args.engine!r}")

    rate = timed(step, n, actions, args.seconds, args.warmup)
    if args.engine == "ray":
        import ray
        ray.shutdown()
    elif hasattr(env, "close"):
        env.close()
    return {"engine": args.engine, "env": args.env, "workers": args.workers,
            "per_worker": args.per_worker, "steps_per_s": rate, **extra}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--engine", required=True)
    p.add_argument("--env", choices=sorted(MAKERS), required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--per-worker", type=int, default=1)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--warmup", type=float, default=0.5)
    print(json.dumps(run(p.parse_args())), flush=True)
    os._exit(0)                   # skip slow interpreter teardown of Ray and friends


if __name__ == "__main__":
    main()
