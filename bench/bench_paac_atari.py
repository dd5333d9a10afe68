"""Atari throughput of the whole training loop (stepping, forward passes and updates):
PAAC under `mpiexec -n N` (N = 2, 3, 4) beside Stable-Baselines3's A2C with the same
number of environments on a SubprocVecEnv, the same CNN and the same preprocessing
(bench/peer_sb3_a2c.py, run in .venv-peers when it has stable_baselines3), one run at a
time, both sides in this one run.

Environments.  --num-envs (32, the paper's n_e) per run, where the worker ranks (N - 1)
can share it evenly; otherwise the nearest count they can (ties round up), stated in
the table: 32 at -n 2 and -n 3, 33 at -n 4 (3 workers).  SB3 runs once per distinct
count, with that many environments.  Both sides build each environment with
gymnasium's own wrappers, as `pal_hpc.envs.make.atari_env` does: v5's sticky actions
(p = 0.25), AtariPreprocessing (frameskip 4 max-pooled, 1..30 no-ops, 84x84 gray,
uint8), FrameStackObservation(4).  (SB3's AtariWrapper would differ: fire on reset,
clipped rewards, life-loss terminals.)

Networks.  --cnn nips (default; PAAC's torso: conv 16 8x8/4, conv 32 4x4/2, dense 256)
on both sides, as an SB3 features extractor with linear policy and value heads on the
shared torso (net_arch []); --cnn nature gives pal_hpc's Nature torso and SB3's own
NatureCNN, which are the same network.  The parameter counts of both are printed.
Updates: both every 5 steps of every environment (PAAC's t_max, SB3's n_steps) on
the whole rollout, RMSProp on both sides; torch one thread per process on both sides.
pal_hpc runs once per --variants entry: fp32 (its defaults), fp32-async
(`--async-update`), bf16 (`--precision bf16`:
its forward and backward passes under torch.autocast to bfloat16; parameters, gradients
and RMSProp stay fp32) and bf16-async (`--async-update` too: each round's gradient runs
on a master thread through the next round, one update of policy lag).  SB3 runs in
fp32, its only mode in A2C, and synchronously.  pal_hpc's
CNN takes its frames channels-last (oneDNN's fast convolutions); SB3's takes them as
they come.

Measurement.  pal_hpc runs --warmup-steps + --steps env steps with no periodic
evaluation (--eval-every 0; the one final evaluation after the loop is outside the
clock); its rate comes from its metrics log's learner rows (rank 0 writes one every 10
updates with the env steps and the wall time): from the first row at or after
--warmup-steps to the last row.  SB3's clock starts at the first rollout that begins at
or after --warmup-steps and stops when learn() returns.  Start-up (MPI, subprocesses,
emulators) is outside both clocks.  env steps are agent steps (4 frames each).

    python bench/bench_paac_atari.py [--nps 2,3,4] [--num-envs 32] [--cnn nips]
                                     [--variants fp32,fp32-async,bf16,bf16-async]
                                     [--warmup-steps 5000] [--steps 20000] [--json OUT]
    python bench/bench_paac_atari.py --quick     # smoke run: -n 4, 1,650 + 3,300 steps
    python bench/bench_paac_atari.py --nps 4 --variants bf16-async --ceiling

Ceiling.  --ceiling also measures, in the same run, what the machine's cores allow:
PAAC's costs per env step (the emulator and its preprocessing, the batched act, the
round's gradient and step; `bench/profile_onpolicy.py --algo paac`, at each row's
precision, environment count and CNN), by one process alone and by one per core at
once.  The ceiling is the loaded cores' summed 1 / (env + act + update); each row of
ours is printed as a fraction of it (issue 37's goal: 90% at the default layout).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

from pal_hpc.cluster.launch import mpi_env, pal_main
from to_target import ROOT, peer_available, run_peer_script, tail

GOAL = 3.0          # pal_hpc at -n 4 at least this many times SB3's env steps/s
GOAL_NP = 4
CEILING_GOAL = 0.9  # of the ceiling, at the default layout (-n 4)
VARIANTS = {"fp32": [], "fp32-async": ["--async-update"], "bf16": ["--precision", "bf16"],
            "bf16-async": ["--precision", "bf16", "--async-update"]}


def env_count(wanted: int, workers: int) -> int:
    """The multiple of `workers` nearest to `wanted` (ties round up), at least one
    environment per worker."""
    lo = wanted // workers * workers
    hi = lo + workers
    return max(workers, hi if hi - wanted <= wanted - lo else lo)


def our_params(env_id: str, cnn: str) -> int:
    """Parameters of PAAC's actor-critic on this game's frames."""
    from pal_hpc.algos.paac import ActorCritic
    from pal_hpc.envs import make_env

    env = make_env(env_id, 0)
    net = ActorCritic(env.observation_space, int(env.action_space.n), cnn)
    env.close()
    return sum(p.numel() for p in net.parameters())


def run_ours(np_: int, num_envs: int, variant: str, args, run_dir: Path) -> dict:
    cmd = pal_main(np_, "--algo", "paac", "--env", args.env, "--seed", str(args.seed),
                   "--num-envs", str(num_envs), "--cnn", args.cnn, *VARIANTS[variant],
                   "--master-envs", args.master_envs,
                   "--total-steps", str(args.warmup_steps + args.steps),
                   "--eval-every", "0", "--eval-episodes", "1",
                   "--run-dir", str(run_dir), "--progress-every", "1000")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                         env=mpi_env(), cwd=ROOT)
    if out.returncode != 0 or not (run_dir / "summary.json").exists():
        raise RuntimeError(f"exit {out.returncode}: {tail(out.stderr or out.stdout)}")
    with h5py.File(run_dir / "metrics.h5", "r") as f:
        rows = f["learner"][:]
    steps, wall = rows["env_step"].astype(np.int64), rows["wall_s"]
    first = np.flatnonzero(steps >= args.warmup_steps)
    if len(first) == 0 or first[0] == len(rows) - 1:
        raise RuntimeError(f"too few learner rows after {args.warmup_steps} warm-up steps "
                           f"({len(rows)} rows); raise --steps")
    i = first[0]
    measured, seconds = int(steps[-1] - steps[i]), float(wall[-1] - wall[i])
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"np": np_, "num_envs": num_envs, "variant": variant, "flags": VARIANTS[variant],
            "warmup_steps": int(steps[i]),
            "measured_steps": measured, "measured_s": round(seconds, 3),
            "env_steps_per_s": measured / seconds, "env_steps": summary["env_steps"],
            "updates": summary["updates"], "master_time": summary.get("master_time"),
            "master_envs": summary.get("master_envs"),
            "env_worker_busy": summary.get("env_worker_busy")}


def run_peer(num_envs: int, args) -> dict:
    return run_peer_script("peer_sb3_a2c.py", [
        "throughput", "--env", args.env, "--num-envs", str(num_envs), "--cnn", args.cnn,
        "--seed", str(args.seed), "--warmup-steps", str(args.warmup_steps),
        "--steps", str(args.steps)], args.timeout)


def precision(variant: str) -> str:
    return "bf16" if variant.startswith("bf16") else "fp32"


def measure_ceilings(args, envs: dict[int, int], variants: list[str]) -> dict:
    """{(envs, precision): bench/profile_onpolicy.py's ceiling} for every pair the rows
    use, measured now (after the runs, on an otherwise idle machine)."""
    from profile_onpolicy import ceiling

    out = {}
    for e in sorted(set(envs.values())):
        for p in sorted({precision(v) for v in variants}):
            print(f"  ceiling: PAAC's per-step costs, {e} envs, {p} ...", flush=True)
            out[(e, p)] = ceiling(args.env, [p], rounds=3, env_steps=3000,
                                  cores=os.cpu_count() or 1, num_envs=e, algo="paac",
                                  flags=("--cnn", args.cnn))
    return out


def ceiling_column(o: dict | None, c: dict | None, fractions: dict, key) -> str:
    if not o or not c:
        return ""
    p = next(k for k in ("fp32", "bf16") if k in c)
    cap = c[p]["ceiling_loaded"]
    fractions[key] = o["env_steps_per_s"] / cap
    return f"  {fractions[key]:4.0%} of {cap:,.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nps", default="2,3,4", help="comma-separated mpiexec -n values (>= 2)")
    ap.add_argument("--env", default="ALE/Pong-v5")
    ap.add_argument("--num-envs", type=int, default=32,
                    help="environments (the nearest multiple of the worker ranks)")
    ap.add_argument("--cnn", choices=("nips", "nature"), default="nips")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated pal_hpc variants to run, from {', '.join(VARIANTS)}")
    ap.add_argument("--warmup-steps", type=int, default=5_000)
    ap.add_argument("--steps", type=int, default=20_000, help="measured env steps")
    ap.add_argument("--master-envs", default="auto",
                    help="pal_hpc's --master-envs: the envs each master steps itself "
                         "(0 = none, auto = the runtime's rule)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run")
    ap.add_argument("--no-peer", action="store_true", help="skip Stable-Baselines3")
    ap.add_argument("--quick", action="store_true", help="smoke run: -n 4, few steps")
    ap.add_argument("--ceiling", action="store_true",
                    help="also measure the machine's ceiling for these runs (both "
                         "cores loaded; bench/profile_onpolicy.py) and print each rate's "
                         "fraction of it")
    ap.add_argument("--json", type=Path, help="also write every run's record here")
    args = ap.parse_args()
    if args.quick:
        args.nps, args.warmup_steps, args.steps = "4", 1_650, 3_300
    nps = [int(x) for x in args.nps.split(",") if x.strip()]
    variants = [x.strip() for x in args.variants.split(",") if x.strip()]
    if not variants or set(variants) - set(VARIANTS):
        ap.error(f"--variants: comma-separated, from {', '.join(VARIANTS)}; got {args.variants!r}")
    if not nps or min(nps) < 2 or args.num_envs < 1 or args.steps < 1 or args.warmup_steps < 0:
        ap.error("every --nps value must be >= 2, --num-envs and --steps >= 1, "
                 "--warmup-steps >= 0")
    sb3 = None if args.no_peer else peer_available()
    envs = {n: env_count(args.num_envs, n - 1) for n in nps}
    print(f"PAAC vs A2C {args.env}: env steps/s of the whole training loop over "
          f"{args.steps:,} env steps after {args.warmup_steps:,} of warm-up; {args.cnn} CNN "
          f"({our_params(args.env, args.cnn):,} parameters in pal_hpc); environments "
          + ", ".join(f"-n {n}: {e}" for n, e in envs.items())
          + f"; {os.cpu_count()} cores, one run at a time", flush=True)
    if sb3:
        print(f"peer: Stable-Baselines3 {sb3} A2C, SubprocVecEnv, same wrappers and CNN "
              f"(bench/peer_sb3_a2c.py)", flush=True)
    elif not args.no_peer:
        print("peer: none -- neither .venv-peers nor .venv has stable_baselines3; "
              "install it with `make bench-peers`", flush=True)

    ours: dict[tuple[int, str], dict | None] = {}
    peers: dict[int, dict | None] = {}
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench_paac_atari-") as tmp:
        for n in nps:
            e = envs[n]
            if sb3 and e not in peers:
                try:
                    peers[e] = run_peer(e, args)
                    print(f"  sb3-a2c       {e:>3} envs: {peers[e]['env_steps_per_s']:8.1f} "
                          f"env steps/s ({peers[e]['params']:,} parameters)", flush=True)
                except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
                    errors.append(f"sb3-a2c {e} envs failed: {exc}")
                    print(f"  ({errors[-1]})", file=sys.stderr, flush=True)
                    peers[e] = None
            for pr in variants:
                key = (n, pr)
                try:
                    ours[key] = run_ours(n, e, pr, args, Path(tmp) / f"np{n}-{pr}")
                    print(f"  pal_hpc -n {n} {pr} {e:>3} envs "
                          f"(master steps {ours[key]['master_envs']}): "
                          f"{ours[key]['env_steps_per_s']:8.1f} env steps/s", flush=True)
                except (RuntimeError, subprocess.TimeoutExpired, OSError, KeyError) as exc:
                    errors.append(f"pal_hpc -n {n} {pr} failed: {exc}")
                    print(f"  ({errors[-1]})", file=sys.stderr, flush=True)
                    ours[key] = None

    ceilings = measure_ceilings(args, envs, variants) if args.ceiling else {}
    print(f"\nPAAC vs SB3 A2C {args.env}, {args.cnn} CNN, env steps/s (4 frames each) of "
          f"the whole training loop")
    print(f"  {'config':<24}{'envs':>6}{'pal_hpc':>10}{'SB3 A2C':>10}{'ours/SB3':>10}"
          f"{'master busy':>13}{'workers busy':>14}"
          + (f"  {'of the ' + str(os.cpu_count()) + '-core ceiling'}" if ceilings else ""))
    show = lambda v, s: "-" if v is None else format(v, s)  # noqa: E731
    ratios, fractions = {}, {}
    for (n, pr), o in ours.items():
        p = peers.get(envs[n])
        r = (o["env_steps_per_s"] / p["env_steps_per_s"]) if o and p else None
        ratios[(n, pr)] = r
        busy = (o or {}).get("master_time") or {}
        print(f"  {f'pal_hpc -n {n} {pr}':<24}{envs[n]:>6}"
              f"{show(o and o['env_steps_per_s'], '.1f'):>10}"
              f"{show(p and p['env_steps_per_s'], '.1f'):>10}"
              f"{show(r, '.2f') + ('x' if r else ''):>10}"
              f"{show(busy.get('busy'), '.0%'):>13}"
              f"{show((o or {}).get('env_worker_busy'), '.0%'):>14}"
              + ceiling_column(o, ceilings.get((envs[n], precision(pr))), fractions, (n, pr)))
    if ceilings:
        from profile_onpolicy import report
        for c in ceilings.values():
            print(report(c))
    met = {}
    for pr in variants:
        r = ratios.get((GOAL_NP, pr))
        if r is not None:
            met[pr] = r >= GOAL
            print(f"goal, -n {GOAL_NP} {pr} vs SB3 A2C with as many environments: >= "
                  f"{GOAL:g}x env steps/s ({r:.2f}x): {'MET' if met[pr] else 'NOT MET'}")
        f = fractions.get((GOAL_NP, pr))
        if f is not None:
            print(f"goal, -n {GOAL_NP} {pr}: >= {CEILING_GOAL:.0%} of the {os.cpu_count()}-core "
                  f"ceiling ({f:.0%}): {'MET' if f >= CEILING_GOAL else 'NOT MET'}")
    if errors:
        print(f"{len(errors)} run(s) failed (see stderr)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "env": args.env, "cnn": args.cnn, "warmup_steps": args.warmup_steps,
            "steps": args.steps, "cores": os.cpu_count(), "sb3_version": sb3,
            "variants": {v: VARIANTS[v] for v in variants},
            "ours": {f"{n} {pr}": o for (n, pr), o in ours.items()},
            "sb3": {str(e): p for e, p in peers.items()},
            "ratios_ours_over_sb3": {f"{n} {pr}": r for (n, pr), r in ratios.items()},
            "ceilings": {f"{e} {p}": c for (e, p), c in ceilings.items()},
            "fractions_of_ceiling": {f"{n} {pr}": f for (n, pr), f in fractions.items()},
            "goal_met": met, "errors": errors}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
