"""An on-policy algorithm's per-env-step costs on one core (`--algo ppo` or `paac`), and
the ceiling they set for a machine's cores.

A round on N envs of T steps costs T batched acts (N observations each), the round's
update (PPO: GAE, then update_epochs x num_minibatches gradients and Adam steps on the
N*T rows; PAAC: one gradient and one RMSProp step on them) and N*T environment steps.
Measured here, each alone, one torch thread, with the algorithm built from the same
flags a run takes (`load_config`: the env family's defaults, `--precision`) and driven
through the on-policy contract the runtime drives (`rollout_act`, `begin_update`,
`update_plan`, `compute_gradients`, `apply_gradients`, `after_step`: the same calls,
without MPI):

- env: one environment stepped bare with random actions in this process (`make_env`:
  for Atari the emulator and its preprocessing), per step;
- act: one batched act (`rollout_act`) over N envs, per env step (/ N);
- update: one round's update, per env step (/ N*T).

Per env step a run pays env + act + update somewhere; C cores that do nothing else can
at most run C / (env + act + update) env steps a second: the ceiling, reached only if
the work splits over the cores with nothing lost (the update is data-parallel over the
masters, the envs over the workers).  Cores are not independent, though: two vCPUs may
share a physical core, caches and memory bandwidth.  So the costs are measured twice,
by one process alone ("solo") and by C processes at once, each doing all of it on its
own core ("loaded"); the loaded ceiling is the sum of the C processes' 1 / (env + act +
update), what the machine gives when every core works.  `bench/bench_ppo.py` and
`bench/bench_paac_atari.py` (`--ceiling`) print a run's rate against both, measured in
the same run.

    python bench/profile_onpolicy.py --env ALE/Pong-v5 [--algo ppo] [--precision fp32,bf16]
    python bench/profile_onpolicy.py --algo paac --env ALE/Pong-v5 --num-envs 33
    python bench/profile_onpolicy.py --env CartPole-v1 --cores 1 --json OUT
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def env_step_ms(env_id: str, steps: int, seed: int = 0) -> float:
    """Milliseconds a step of one `make_env` environment with random actions (resets
    included where episodes end)."""
    from pal_hpc.envs import make_env

    env = make_env(env_id, seed)
    env.action_space.seed(seed)
    env.reset(seed=seed)
    for _ in range(50):                                      # warm-up
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            env.reset()
    t0 = time.perf_counter()
    for _ in range(steps):
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            env.reset()
    dt = time.perf_counter() - t0
    env.close()
    return dt / steps * 1e3


def build(algo: str, env_id: str, precision: str, num_envs: int | None, seed: int = 0,
          flags: tuple[str, ...] = ()):
    """(the algorithm as `pal_hpc.main --algo ALGO --env ENV --precision P [flags]`
    builds it, the env, the run's config)."""
    import torch

    from pal_hpc.algos import ALGOS
    from pal_hpc.config_io import load_config
    from pal_hpc.envs import make_env
    from pal_hpc.runtime.threads import limit_threads

    limit_threads(1)        # torch's threads and numpy's OpenBLAS, as the ranks
    argv = ["--algo", algo, "--env", env_id, "--precision", precision, "--seed", str(seed)]
    if num_envs:
        argv += ["--num-envs", str(num_envs)]
    cfg = load_config(argv + list(flags))
    env = make_env(env_id, seed)
    acfg = cfg.algo_config
    return ALGOS[algo](env.observation_space, env.action_space, acfg, seed=seed), env, acfg


def network_ms(algo_name: str, env_id: str, precision: str, rounds: int,
               num_envs: int | None = None, seed: int = 0,
               flags: tuple[str, ...] = ()) -> dict:
    """{"act": ms per env step, "update": ms per env step, "envs", "steps"} of the
    on-policy algorithm at its defaults for `env_id` and `precision` (and `flags`)."""
    algo, env, acfg = build(algo_name, env_id, precision, num_envs, seed, flags)
    algo.set_progress(0.0)
    rng = np.random.default_rng(seed)
    n, t = int(acfg.num_envs), type(algo).rollout_steps(acfg)
    if n == 0:                            # PAAC's auto: the paper's 32 (one master alone)
        from pal_hpc.algos.paac.config import resolve_num_envs
        n = resolve_num_envs(0, 0)
    space = env.observation_space

    def observations(*lead):
        if space.dtype == np.uint8:
            return rng.integers(0, 256, size=(*lead, *space.shape), dtype=np.uint8)
        return rng.normal(size=(*lead, *space.shape)).astype(space.dtype)

    obs = observations(t + 1, n)
    for _ in range(3):                                       # warm-up
        algo.rollout_act(obs[0], rng)
    acts, extras = [], []
    t0 = time.perf_counter()
    for i in range(t):
        a, extra = algo.rollout_act(obs[i], rng)
        acts.append(a)
        extras.append(extra)
    act = (time.perf_counter() - t0) / (n * t) * 1e3
    batch = {"obs": obs, "action": np.stack(acts),
             "reward": rng.normal(size=(t, n)).astype(np.float32),
             "terminated": rng.random((t, n)) < 0.01, "truncated": np.zeros((t, n), bool),
             "valid": np.ones((t, n), bool)}
    for name in algo.rollout_fields():
        batch[name] = np.stack([e[name] for e in extras])
    size = algo.num_params + type(algo).update_sums
    grad = np.zeros(size, np.float32)
    times = []
    for _ in range(rounds + 1):                              # the first is a warm-up
        t0 = time.perf_counter()
        mine = algo.begin_update(batch)
        for step in algo.update_plan(batch, None if mine is None else [mine], 0):
            algo.compute_gradients(algo.phase, step, grad[:algo.num_params])
            sums = algo.step_sums().copy()
            algo.apply_gradients(algo.phase, grad[:algo.num_params],
                                 scale=algo.grad_scale(1))
            algo.after_step(sums)
        times.append(time.perf_counter() - t0)
    update = min(times[1:]) / (n * t) * 1e3
    env.close()
    return {"act": act, "update": update, "envs": n, "steps": t}


def costs(algo: str, env_id: str, precision: str, rounds: int, env_steps: int,
          num_envs: int | None = None, flags: tuple[str, ...] = ()) -> dict:
    """One process's per-env-step costs (ms): {"env_ms", "act_ms", "update_ms",
    "step_ms", "envs", "steps"}."""
    env = env_step_ms(env_id, env_steps)
    net = network_ms(algo, env_id, precision, rounds, num_envs, flags=flags)
    return {"env_ms": env, "act_ms": net["act"], "update_ms": net["update"],
            "step_ms": env + net["act"] + net["update"], "envs": net["envs"],
            "steps": net["steps"]}


def loaded_costs(args: list[str], copies: int, timeout: float = 900) -> list[dict]:
    """`costs` measured by `copies` processes of this script at once (one torch thread
    each), every one on the whole work: [their results]."""
    with tempfile.TemporaryDirectory(prefix="profile_onpolicy-") as tmp:
        outs = [Path(tmp) / f"{i}.json" for i in range(copies)]
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        procs = [subprocess.Popen([sys.executable, __file__, *args, "--worker", str(o)],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True) for o in outs]
        for p in procs:
            _, err = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise RuntimeError(f"profile_onpolicy worker: exit {p.returncode}: {err[-2000:]}")
        return [json.loads(o.read_text()) for o in outs]


def ceiling(env_id: str, precisions: list[str], rounds: int, env_steps: int,
            cores: int, num_envs: int | None = None, algo: str = "ppo",
            flags: tuple[str, ...] = ()) -> dict:
    """Every figure of the module docstring, per precision: {"cores", precision:
    {"solo": costs, "loaded": [costs of each of `cores` processes at once],
    "ceiling_solo", "ceiling_loaded": env steps/s}}."""
    out = {"algo": algo, "env": env_id, "cores": cores, "flags": list(flags)}
    for p in precisions:
        solo = costs(algo, env_id, p, rounds, env_steps, num_envs, flags)
        argv = ["--algo", algo, "--env", env_id, "--precision", p, "--rounds", str(rounds),
                "--env-steps", str(env_steps)] + (["--num-envs", str(num_envs)]
                                                  if num_envs else [])
        if flags:
            argv += ["--pal-flags", " ".join(flags)]
        loaded = loaded_costs(argv, cores) if cores > 1 else [solo]
        out[p] = {"solo": solo, "loaded": loaded,
                  "ceiling_solo": cores * 1e3 / solo["step_ms"],
                  "ceiling_loaded": sum(1e3 / c["step_ms"] for c in loaded)}
    return out


def report(c: dict) -> str:
    """The costs and ceilings, a few lines per precision."""
    lines = [f"{c.get('algo', 'ppo').upper()} per-env-step costs on {c['env']} (ms; 1 torch thread; solo = one "
             f"process alone, loaded = {c['cores']} processes at once, their mean)"]
    for p in ("fp32", "bf16"):
        if p not in c:
            continue
        r = c[p]
        k = len(r["loaded"])
        for name, x in (("solo", r["solo"]), ("loaded", {
                key: sum(d[key] for d in r["loaded"]) / k
                for key in ("env_ms", "act_ms", "update_ms", "step_ms")})):
            lines.append(f"  {p} {name:6s}: env {x['env_ms']:.3f} + act {x['act_ms']:.3f} + "
                         f"update {x['update_ms']:.3f} = {x['step_ms']:.3f} ms an env step")
        lines.append(f"  {p} ceiling on {c['cores']} cores ({r['solo']['envs']} envs x "
                     f"{r['solo']['steps']} steps a round): {r['ceiling_loaded']:,.0f} env "
                     f"steps/s loaded, {r['ceiling_solo']:,.0f} from the solo costs")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algo", default="ppo", choices=["ppo", "paac"])
    ap.add_argument("--env", default="ALE/Pong-v5")
    ap.add_argument("--precision", default="fp32", help="comma-separated: fp32,bf16")
    ap.add_argument("--rounds", type=int, default=2, help="timed updates (best kept)")
    ap.add_argument("--env-steps", type=int, default=3000)
    ap.add_argument("--num-envs", type=int, help="default: the run's (the env family's)")
    ap.add_argument("--pal-flags", default="", metavar="FLAGS",
                    help="more flags of the run, as one string (say \"--cnn nature\")")
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)   # loaded_costs' copies
    args = ap.parse_args()
    precisions = [p.strip() for p in args.precision.split(",") if p.strip()]
    bad = [p for p in precisions if p not in ("fp32", "bf16")]
    if bad:
        ap.error(f"--precision: {', '.join(bad)} is not fp32 or bf16")
    if args.cores < 1:
        ap.error(f"--cores: must be >= 1, got {args.cores}")
    flags = tuple(shlex.split(args.pal_flags))
    if args.worker:
        args.worker.write_text(json.dumps(costs(args.algo, args.env, precisions[0],
                                                args.rounds, args.env_steps,
                                                args.num_envs, flags)))
        return 0
    c = ceiling(args.env, precisions, args.rounds, args.env_steps, args.cores, args.num_envs,
                args.algo, flags)
    print(report(c))
    if args.json:
        args.json.write_text(json.dumps(c, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
