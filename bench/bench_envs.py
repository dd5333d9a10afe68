"""Environment-step throughput with only actors stepping a random policy: pal_hpc's actor
ranks beside gymnasium's AsyncVectorEnv, for A = 1..4 actor ranks.

  pal_hpc     `mpiexec -n A` bench/env_worker.py: every rank is a real
              pal_hpc.runtime.actor.Actor (as run.py builds it) with --envs-per-actor
              (8) environments, epsilon 1 (random actions, the policy's forward pass
              still runs), writing n-step transitions into the node's SharedReplay as
              in training.  A processes, A * E environments.
  AVE same procs   gymnasium.vector.AsyncVectorEnv with num_envs = A: A worker
              processes (one env each, the most it runs per process), the same
              process count as ours.
  AVE same envs    AsyncVectorEnv with num_envs = A * E: the same environment count as
              ours, in A * E worker processes.
  Both AsyncVectorEnv rows: shared_memory=True (the default), autoreset_mode SAME_STEP
  (an episode's reset happens inside the step that ended it, as pal_hpc's actor does,
  so every counted step is a real env.step), actions from envs.action_space.sample(),
  env built by pal_hpc.envs.make_env (the same wrappers as ours), stepped from
  one parent process (which is extra: A + 1 busy processes).  Each one runs in a
  subprocess of this script (main venv; gymnasium is there).

Every run steps untimed for --warmup seconds after start-up, then is timed for
--seconds.  Ratios are pal_hpc steps/s over AsyncVectorEnv steps/s (above 1: we step
faster).  Ranks or workers beyond the core count oversubscribe the machine.

    python bench/bench_envs.py [--seconds 5] [--actors 1,2,3,4] [--envs-per-actor 8]
                               [--env CartPole-v1] [--json OUT]
    python bench/bench_envs.py --quick          # 1 s runs, A in 1, 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from pal_hpc.cluster.launch import mpi_env, mpiexec

ROOT = Path(__file__).resolve().parent.parent


def _last_json(out: subprocess.CompletedProcess, what: str) -> dict:
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{what} failed (exit {out.returncode}):\n{out.stdout[-1500:]}\n"
                           f"{out.stderr[-1500:]}")
    return json.loads(lines[-1])


def ours(actors: int, args) -> dict:
    cmd = mpiexec(actors, ROOT / "bench" / "env_worker.py", "--env", args.env,
           "--seconds", str(args.seconds), "--warmup", str(args.warmup),
           "--envs-per-actor", str(args.envs_per_actor))
    env = mpi_env()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=120 + 3 * (args.seconds + args.warmup))
    return _last_json(out, f"mpiexec -n {actors} env_worker.py")


def peer(num_envs: int, args) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_peer-run", str(num_envs),
           "--env", args.env, "--seconds", str(args.seconds), "--warmup", str(args.warmup)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, OMP_NUM_THREADS="1"),
                         timeout=120 + 3 * (args.seconds + args.warmup))
    return _last_json(out, f"AsyncVectorEnv num_envs={num_envs}")


def peer_run(num_envs: int, env_id: str, seconds: float, warmup: float) -> dict:
    """In a subprocess: step an AsyncVectorEnv with random actions, print one JSON line."""
    import functools

    import gymnasium as gym

    sys.path.insert(0, str(ROOT))
    from pal_hpc.envs import make_env

    fns = [functools.partial(make_env, env_id, 1_000 + i) for i in range(num_envs)]
    envs = gym.vector.AsyncVectorEnv(fns, shared_memory=True,
                                     autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        envs.reset(seed=0)
        envs.action_space.seed(0)

        def run_for(secs: float) -> tuple[int, int, float]:
            calls = episodes = 0
            t0 = time.perf_counter()
            deadline = t0 + secs
            while time.perf_counter() < deadline:
                _, _, terminated, truncated, _ = envs.step(envs.action_space.sample())
                episodes += int((terminated | truncated).sum())
                calls += 1
            return calls, episodes, time.perf_counter() - t0

        run_for(warmup)
        calls, episodes, elapsed = run_for(seconds)
    finally:
        envs.close()
    return {"env": env_id, "num_envs": num_envs, "workers": num_envs, "seconds": seconds,
            "steps_per_s": calls * num_envs / elapsed, "env_steps": calls * num_envs,
            "step_calls": calls, "episodes": episodes, "elapsed_s": elapsed,
            "gymnasium": gym.__version__}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--seconds", type=float, default=5.0, help="timed seconds per run")
    ap.add_argument("--warmup", type=float, default=0.3, help="untimed seconds per run")
    ap.add_argument("--actors", default="1,2,3,4", help="comma-separated actor-rank counts")
    ap.add_argument("--envs-per-actor", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="1 s runs, A in 1, 2")
    ap.add_argument("--json", type=Path, help="also write every measurement to this file")
    ap.add_argument("--_peer-run", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._peer_run:
        print(json.dumps(peer_run(args._peer_run, args.env, args.seconds, args.warmup)), flush=True)
        return 0
    if args.quick:
        args.seconds, args.actors = 1.0, "1,2"
    actor_counts = [int(x) for x in args.actors.split(",") if x.strip()]
    if not actor_counts or min(actor_counts) < 1 or args.envs_per_actor < 1 or args.seconds <= 0:
        ap.error("--actors values, --envs-per-actor and --seconds must be positive")
    E = args.envs_per_actor

    print(f"Env-step throughput, {args.env}, random actions, {args.seconds:g} s per run "
          f"(+{args.warmup:g} s warm-up); {os.cpu_count()} cores, more processes than "
          f"cores oversubscribe")
    print(f"  pal_hpc: A actor ranks x {E} envs, real Actor incl. policy forward pass and "
          f"replay writes")
    print(f"  AVE same procs: AsyncVectorEnv num_envs = A (A workers); "
          f"AVE same envs: num_envs = A*{E} (A*{E} workers)")
    print(f"  {'actors':>6} {'envs':>5} {'pal_hpc/s':>10} | {'AVE same procs/s':>16} {'ratio':>6} "
          f"| {'AVE same envs/s':>15} {'ratio':>6}")
    records = []
    for a in actor_counts:
        mine = ours(a, args)
        same_procs = peer(a, args)
        same_envs = peer(a * E, args)
        records.append({"actors": a, "envs_per_actor": E, "pal_hpc": mine,
                        "async_vector_env_same_procs": same_procs,
                        "async_vector_env_same_envs": same_envs})
        r1 = mine["steps_per_s"] / same_procs["steps_per_s"]
        r2 = mine["steps_per_s"] / same_envs["steps_per_s"]
        print(f"  {a:>6} {a * E:>5} {mine['steps_per_s']:>10,.0f} | "
              f"{same_procs['steps_per_s']:>16,.0f} {r1:>5.2f}x | "
              f"{same_envs['steps_per_s']:>15,.0f} {r2:>5.2f}x", flush=True)
    print("ratio = pal_hpc steps/s / AsyncVectorEnv steps/s (above 1: pal_hpc steps faster)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"env": args.env, "seconds": args.seconds,
                                         "warmup": args.warmup, "cores": os.cpu_count(),
                                         "records": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
