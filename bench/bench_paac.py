"""Time to solve CartPole-v1: PAAC under `mpiexec -n 4` beside Stable-Baselines3's A2C
with rl-baselines3-zoo's CartPole-v1 hyperparameters (bench/peer_sb3_a2c.py, run in
.venv-peers when it has stable_baselines3), seeds 0..K-1, one run at a time, both sides
in this one run.

Protocol, the same on both sides: up to --total-steps (500k, the zoo's n_timesteps) env
steps; when the step counter first reaches a multiple of --eval-every (10k, PAAC's
default) a greedy evaluation, the mean return of --eval-episodes (10) episodes on fresh
environments seeded seed + 10**6 + env steps + i (a final one after the last step,
seed + 2 * 10**6, counts too); the run stops at the first evaluation whose mean reaches
--target (475).  Wall-clock to the target runs from the start of training (after setup)
to the end of that evaluation MINUS the time spent evaluating up to it
(`time_to_target_excl_eval_s` on both sides): SB3 evaluates inline in its one process,
pal_hpc on its master (rank 0) while the workers wait, so excluding it on both sides
compares training alone.  torch runs one thread per process on both sides.

Hyperparameters.
  - SB3 A2C: the zoo's hyperparams/a2c.yml CartPole-v1 entry sets only n_envs 8,
    n_timesteps 5e5, policy MlpPolicy, ent_coef 0.0; the rest are SB3's A2C defaults:
    learning_rate 7e-4 constant, n_steps 5, gamma 0.99, gae_lambda 1.0 (n-step
    returns), vf_coef 0.5, max_grad_norm 0.5, RMSprop alpha 0.99 eps 1e-5,
    normalize_advantage False, separate pi / vf MLPs [64, 64] (tanh), 8 environments in
    a DummyVecEnv (the zoo's default vector env).
  - pal_hpc PAAC, three settings (--settings, all by default):
    paper: its defaults, the paper's (released code's): t_max 5, 32 environments
    (33 at -n 4 with --master-envs 0: a multiple of the 3 worker ranks), RMSProp lr 0.0224
    annealed linearly to 0 over --total-steps, TensorFlow-style with decay 0.99 and eps
    0.1, global gradient-norm clip 3.0, entropy 0.02, loss x 5 with value_coef 0.25 (the
    released code's), gamma 0.99, a shared ReLU MLP torso [64, 64] with policy and
    value heads; no reward clipping (vector observations).
    zoo: the same hyperparameters as the SB3 peer, as PAAC flags (ZOO_FLAGS): 8
    environments (9 at -n 4 with --master-envs 0, a multiple of the 3 worker ranks;
    under auto, the default, the layout takes any count), lr 7e-4 constant, torch-style
    RMSprop eps 1e-5, clip 0.5, entropy 0, separate tanh MLPs [64, 64] for policy and
    value, orthogonal initialization.  This row compares the two runtimes on one
    algorithm with one set of hyperparameters; the paper row shows what PAAC's own
    settings, tuned for Atari, give on CartPole.
    zoo32: the zoo's settings with PAAC's batch, 32 environments (33 at -n 4 with
    --master-envs 0), and PAAC's rule that the learning rate grows with the
    environments (the paper's 0.0007 x n_e): 7e-4 x 32 / 8 = 2.8e-3.  More
    environments per round spread the round's fixed costs (a lockstep handoff per
    step, one update) over more steps.
    Both sides are advantage actor-critic with 5-step bootstrapped returns.

Per configuration the tables show each seed's time and env steps to the target, the
median over seeds, how many seeds reached it, and SB3's median / ours (above 1:
pal_hpc is faster, or needed fewer env steps).  A seed that did not reach the target
(or whose run failed) enters the median as +infinity.  Then the conservative ratio,
SB3's fastest seed / our median, and the goal check for -n 4: at least 3x faster than
SB3 by the median and by the conservative ratio.  Last, each side's env steps per
second of training up to the target (the median over the seeds): the runtimes' speed
apart from when each seed's evaluation first crossed the target.

    python bench/bench_paac.py [--seeds 5] [--nps 4] [--settings paper,zoo,zoo32] [--json OUT]
    python bench/bench_paac.py --quick     # smoke run: 1 seed, 100k steps
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pal_hpc.cluster.launch import mpi_env, pal_main
from to_target import (ROOT, fmt, peer_available, peer_banner, ratio, reached,
                       run_peer_script, run_seeds, tail)

TIME_KEY = "time_to_target_excl_eval_s"
PEER = "sb3-a2c"
GOAL_SPEEDUP = 3.0
GOAL_NP = 4
# SB3 A2C's CartPole hyperparameters (bench/peer_sb3_a2c.py) as PAAC flags; --num-envs is
# 8, rounded up to a multiple of the worker ranks under --master-envs 0 (settings_flags).
ZOO_FLAGS = ["--lr", "7e-4", "--no-lr-anneal", "--rms-style", "torch", "--rms-eps", "1e-5",
             "--grad-clip", "0.5", "--entropy", "0", "--value-coef", "0.5", "--loss-scale", "1",
             "--activation", "tanh", "--no-shared-torso", "--init", "orthogonal"]
ZOO_ENVS = 8
PAAC_ENVS = 32
SETTINGS = ("paper", "zoo", "zoo32")


def settings_flags(settings: str, np_: int, master_envs: str = "auto") -> list[str]:
    """PAAC's flags for `settings` at -n np_ (np_ - 1 worker ranks share the envs; under
    --master-envs auto or all, any count fits the layout: the zoo's 8 stay 8)."""
    if settings == "paper":
        return []
    workers = 1 if master_envs in ("auto", "all") else np_ - 1
    if settings == "zoo":
        return ZOO_FLAGS + ["--num-envs", str(-(-ZOO_ENVS // workers) * workers)]
    envs = -(-PAAC_ENVS // workers) * workers
    flags = list(ZOO_FLAGS)
    flags[flags.index("--lr") + 1] = f"{7e-4 * envs / ZOO_ENVS:.4g}"
    return flags + ["--num-envs", str(envs)]


def run_ours(np_: int, settings: str, seed: int, args, run_dir: Path) -> dict:
    cmd = pal_main(np_, "--algo", "paac", "--env", args.env, "--seed", str(seed),
                   *settings_flags(settings, np_, args.master_envs),
                   "--master-envs", args.master_envs,
                   "--total-steps", str(args.total_steps), "--target-return", str(args.target),
                   "--eval-every", str(args.eval_every),
                   "--eval-episodes", str(args.eval_episodes),
                   "--run-dir", str(run_dir), "--progress-every", "1000")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                         env=mpi_env(), cwd=ROOT)
    summary = run_dir / "summary.json"
    if out.returncode != 0 or not summary.exists():
        raise RuntimeError(f"exit {out.returncode}: {tail(out.stderr or out.stdout)}")
    return json.loads(summary.read_text())


def run_peer(seed: int, args) -> dict:
    return run_peer_script("peer_sb3_a2c.py", [
        "target", "--seed", str(seed), "--env", args.env,
        "--total-steps", str(args.total_steps), "--target", str(args.target),
        "--eval-every", str(args.eval_every), "--eval-episodes", str(args.eval_episodes)],
        args.timeout)


def div(a: float, b: float) -> float | None:
    """a / b, None when either side did not reach the target."""
    return None if math.isinf(a) or math.isinf(b) else a / b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5, help="run seeds 0..K-1")
    ap.add_argument("--nps", default="4", help="comma-separated mpiexec -n values (>= 2)")
    ap.add_argument("--settings", default="paper,zoo,zoo32",
                    help="comma-separated PAAC settings: paper (its defaults), zoo (the SB3 "
                         "peer's hyperparameters as PAAC flags), zoo32 (those with PAAC's "
                         "32 environments and a learning rate scaled to them)")
    ap.add_argument("--master-envs", default="auto",
                    help="pal_hpc's --master-envs: the envs each master steps itself "
                         "(0 = none, auto = the runtime's rule)")
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--total-steps", type=int, default=500_000)
    ap.add_argument("--target", type=float, default=475.0)
    ap.add_argument("--eval-every", type=int, default=10_000)
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--no-peer", action="store_true", help="skip Stable-Baselines3")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 seed, 100k steps")
    ap.add_argument("--json", type=Path, help="also write every run's record here")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.total_steps = 1, 100_000
    nps = [int(x) for x in args.nps.split(",") if x.strip()]
    settings = [x.strip() for x in args.settings.split(",") if x.strip()]
    if args.seeds < 1 or not nps or min(nps) < 2:
        ap.error("--seeds must be >= 1 and every --nps value >= 2 (a master + workers)")
    if not settings or set(settings) - set(SETTINGS):
        ap.error(f"--settings: comma-separated, from {', '.join(SETTINGS)}; got {args.settings!r}")
    seeds = list(range(args.seeds))
    sb3 = None if args.no_peer else peer_available()

    print(f"PAAC vs A2C {args.env}: time to a greedy mean return of {args.target:g} "
          f"excluding evaluation time (eval every {args.eval_every:,} steps, "
          f"{args.eval_episodes} episodes), at most {args.total_steps:,} env steps, seeds "
          f"{seeds}; {os.cpu_count()} cores, one run at a time", flush=True)
    peer_banner(sb3, args.no_peer, "A2C, rl-baselines3-zoo CartPole-v1 hyperparameters "
                                   "(bench/peer_sb3_a2c.py)")

    ours_cfgs = {f"pal_hpc -n {n} {st}": (n, st) for st in settings for n in nps}
    configs = list(ours_cfgs) + ([PEER] if sb3 else [])
    errors: list[str] = []

    def run_one(cfg: str, seed: int) -> dict:
        if cfg == PEER:
            return run_peer(seed, args)
        n, st = ours_cfgs[cfg]
        return run_ours(n, st, seed, args, Path(tmp) / f"{n}-{st}-{seed}")

    with tempfile.TemporaryDirectory(prefix="bench_paac-") as tmp:
        records = run_seeds(configs, seeds, run_one, TIME_KEY, errors, width=20)

    med = {}
    for cfg in configs:
        times = [reached(records[cfg][s], TIME_KEY) for s in seeds]
        steps = [reached(records[cfg][s], "steps_to_target") for s in seeds]
        med[cfg] = {"time": statistics.median(times), "steps": statistics.median(steps),
                    "times": times, "steps_list": steps,
                    "reached": sum(not math.isinf(t) for t in times)}
    for title, key, each, spec in (("wall-clock to target excl. evaluation (s)", "time",
                                    "times", ".1f"),
                                   ("env steps to target", "steps", "steps_list", ",.0f")):
        print(f"\nPAAC vs SB3 A2C {args.env}, {title}, target {args.target:g}")
        head = "".join(f"{'seed ' + str(s):>10}" for s in seeds)
        peer_col = f"{'SB3/ours':>10}" if sb3 else ""
        print(f"  {'config':<20}{head}{'median':>10}{'reached':>9}{peer_col}")
        for cfg in configs:
            m = med[cfg]
            row = "".join(f"{fmt(v, spec):>10}" for v in m[each])
            col = "" if not sb3 or cfg == PEER else f"{ratio(med[PEER][key], m[key]):>10}"
            print(f"  {cfg:<20}{row}{fmt(m[key], spec):>10}"
                  f"{str(m['reached']) + '/' + str(len(seeds)):>9}{col}")
    # The runtimes' speed apart from each seed's luck (when its greedy evaluation first
    # crossed the target): env steps per second of training up to the target.
    for cfg in configs:
        rates = [st / t for st, t in zip(med[cfg]["steps_list"], med[cfg]["times"])
                 if not math.isinf(t) and t > 0]
        med[cfg]["rate"] = statistics.median(rates) if rates else math.nan
    print("\nenv steps/s of training up to the target (median over the seeds that "
          "reached it): the runtimes' speed, whatever each seed's luck")
    peer_rate = med[PEER]["rate"] if sb3 else math.nan
    for cfg in configs:
        col = ("" if cfg == PEER or math.isnan(med[cfg]["rate"]) or math.isnan(peer_rate)
               else f"  ours/SB3 {med[cfg]['rate'] / peer_rate:.2f}x")
        print(f"  {cfg:<20}{fmt(med[cfg]['rate'], ',.0f'):>10}{col}")
    goal = None
    if sb3:
        best = min(med[PEER]["times"])
        print(f"conservative, SB3's fastest seed ({fmt(best, '.1f')} s) / our median: "
              + ", ".join(f"{c.replace('pal_hpc ', '')} {ratio(best, med[c]['time'])}"
                          for c in configs if c != PEER))
        goal = {}
        for st in settings:
            ours = f"pal_hpc -n {GOAL_NP} {st}"
            if ours not in med:
                continue
            speed = div(med[PEER]["time"], med[ours]["time"])
            cons = div(best, med[ours]["time"])
            met = (speed is not None and cons is not None and speed >= GOAL_SPEEDUP
                   and cons >= GOAL_SPEEDUP)
            show = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
            print(f"goal, -n {GOAL_NP} {st} settings vs SB3 A2C: >= {GOAL_SPEEDUP:g}x faster "
                  f"(median {show(speed)}x, conservative {show(cons)}x): "
                  f"{'MET' if met else 'NOT MET'}")
            goal[st] = {"speedup_median": speed, "speedup_conservative": cons, "met": met}
    print("\nnot reached ('-') counts as +inf in the median; SB3/ours > 1: pal_hpc is faster "
          "(or used fewer env steps)")
    if errors:
        print(f"{len(errors)} run(s) failed (see stderr); they count as not reached")
    if args.json:
        enc = lambda v: None if math.isinf(v) else v  # noqa: E731
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "env": args.env, "target": args.target, "total_steps": args.total_steps,
            "eval_every": args.eval_every, "eval_episodes": args.eval_episodes,
            "time_key": TIME_KEY, "seeds": seeds, "nps": nps, "settings": settings,
            "zoo_flags": ZOO_FLAGS, "cores": os.cpu_count(),
            "sb3_version": sb3,
            "runs": {c: {str(s): records[c][s] for s in seeds} for c in configs},
            "medians": {c: {TIME_KEY: enc(med[c]["time"]),
                            "steps_to_target": enc(med[c]["steps"]),
                            "env_steps_per_s": (None if math.isnan(med[c]["rate"])
                                                else med[c]["rate"]),
                            "reached": med[c]["reached"]} for c in configs},
            "goal": goal, "errors": errors}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
