"""PPO: pal_hpc's --algo ppo beside Stable-Baselines3's PPO with the same
hyperparameters (CleanRL's: bench/peer_sb3_ppo.py lists them as SB3 arguments), both
sides in this one run, one run at a time.  CartPole-v1 (the default) takes ppo.py's
settings; a Box-action env (--env Hopper-v4, with the mujoco package: `make
install-mujoco`) ppo_continuous_action.py's, observation and reward normalization
included.

1. Time to target, seeds 0..K-1: up to --total-steps (CleanRL's: CartPole 500k, MuJoCo
   1M) env steps, a greedy evaluation (--eval-episodes 10 episodes on fresh environments
   seeded seed + 10**6 + env steps + i) each time the step counter first reaches a
   multiple of --eval-every (10k; MuJoCo 50k), stop at the first whose mean reaches
   --target (CartPole 475, Hopper 1,500).  The time is `time_to_target_excl_eval_s` on
   both sides: from the start of training to that evaluation, minus the time spent
   evaluating.  A seed that did not get there counts as +infinity in the median.
2. Throughput: env steps per second of the whole training loop (stepping, acting,
   updates; no evaluation) over --throughput-steps env steps (100k; MuJoCo 50k), the
   median of --repeats runs a side (1), interleaved; with --cleanrl DIR CleanRL's own
   script (ppo.py or ppo_continuous_action.py from that checkout, in .venv-cleanrl:
   bash bench/install_cleanrl.sh) joins these rows with the SPS it prints.
   --throughput-only skips part 1.

The goal (issue 36): at least 2x SB3 on the median time to target.

    python bench/bench_ppo.py [--seeds 5] [--nps 1] [--json OUT]
    python bench/bench_ppo.py --env Hopper-v4 --seeds 3 --cleanrl ~/cleanrl/cleanrl
    python bench/bench_ppo.py --quick        # 2 seeds, 100k steps
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
from to_target import ROOT, fmt, ratio, reached, run_seeds, tail

TIME_KEY = "time_to_target_excl_eval_s"
PEER = "sb3-ppo"
GOAL = 2.0
# Per action-space family: the run's length (CleanRL's total_timesteps), the greedy
# target, the evaluation cadence, and the throughput run's length.
# The target of a continuous env other than these is --target.
DEFAULTS = {
    "discrete": {"total_steps": 500_000, "target": 475.0, "eval_every": 10_000,
                 "throughput_steps": 100_000},
    "continuous": {"total_steps": 1_000_000, "eval_every": 50_000,
                   "throughput_steps": 50_000},
}
TARGETS = {"Hopper-v4": 1500.0, "Hopper-v5": 1500.0}


def box_actions(env_id: str) -> bool:
    import gymnasium as gym

    with gym.make(env_id) as env:
        return isinstance(env.action_space, gym.spaces.Box)


def peer_python() -> Path | None:
    """.venv-peers' python when it has stable_baselines3, else .venv's, else None."""
    for venv in (".venv-peers", ".venv"):
        py = ROOT / venv / "bin" / "python"
        if py.exists() and subprocess.run([str(py), "-c", "import stable_baselines3"],
                                          capture_output=True, timeout=120).returncode == 0:
            return py
    return None


def run_peer(py: Path, args: list[str], timeout: float) -> dict:
    out = subprocess.run([str(py), str(ROOT / "bench" / "peer_sb3_ppo.py"), *args],
                         capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"exit {out.returncode}: {tail(out.stderr)}")
    return json.loads(lines[-1])


CLEANRL = "cleanrl"
CLEANRL_PYTHON = ROOT / ".venv-cleanrl" / "bin" / "python"


def run_cleanrl(args, steps: int, workdir: Path) -> float:
    """CleanRL's own script (ppo.py, or ppo_continuous_action.py for Box actions) from
    the checkout `args.cleanrl`, in .venv-cleanrl (bench/install_cleanrl.sh), for
    `steps` env steps on the CPU with one torch thread: the SPS it prints last (its
    global step over the seconds since its loop began; no evaluation in between)."""
    script = args.cleanrl / ("ppo_continuous_action.py" if args.family == "continuous"
                             else "ppo.py")
    workdir.mkdir(parents=True, exist_ok=True)        # it writes runs/ into its cwd
    out = subprocess.run([str(CLEANRL_PYTHON), str(script), "--env-id", args.env,
                          "--total-timesteps", str(steps), "--no-cuda", "--seed", "0"],
                         capture_output=True, text=True, timeout=args.timeout, cwd=workdir,
                         env=dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1"))
    sps = [line.split()[-1] for line in out.stdout.splitlines() if line.startswith("SPS:")]
    if out.returncode != 0 or not sps:
        raise RuntimeError(f"exit {out.returncode}: {tail(out.stderr or out.stdout)}")
    return float(sps[-1])


def run_ours(np_: int, args, run_dir: Path, *flags: str) -> dict:
    cmd = pal_main(np_, "--algo", "ppo", "--env", args.env, "--run-dir", str(run_dir),
                   "--progress-every", "1000", *flags)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                         env=mpi_env(), cwd=ROOT)
    summary = run_dir / "summary.json"
    if out.returncode != 0 or not summary.exists():
        raise RuntimeError(f"exit {out.returncode}: {tail(out.stderr or out.stdout)}")
    return json.loads(summary.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="CartPole-v1",
                    help="CartPole-v1 (ppo.py's settings) or a Box-action env such as "
                         "Hopper-v4 (ppo_continuous_action.py's; needs the mujoco package: "
                         "make install-mujoco)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--nps", default="1", help="comma-separated mpiexec -n values")
    ap.add_argument("--total-steps", type=int, help="default: the family's (below)")
    ap.add_argument("--target", type=float, help="default: the family's (below)")
    ap.add_argument("--eval-every", type=int, help="default: the family's (below)")
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--throughput-steps", type=int, help="default: the family's (below)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--cleanrl", type=Path, metavar="DIR",
                    help="a checkout's cleanrl/ folder (github.com/vwxyzjn/cleanrl): its "
                         "PPO script joins the throughput rows, run in .venv-cleanrl "
                         "(bash bench/install_cleanrl.sh)")
    ap.add_argument("--throughput-only", action="store_true",
                    help="skip the time to target")
    ap.add_argument("--repeats", type=int, default=1,
                    help="throughput runs per side, interleaved; the median is printed")
    ap.add_argument("--quick", action="store_true", help="2 seeds, 100k steps")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    family = args.family = "continuous" if box_actions(args.env) else "discrete"
    if args.cleanrl and not (CLEANRL_PYTHON.exists() and (args.cleanrl / "ppo.py").exists()):
        ap.error(f"--cleanrl {args.cleanrl}: needs its ppo.py there and "
                 f"{CLEANRL_PYTHON.relative_to(ROOT)} (bash bench/install_cleanrl.sh)")
    defaults = dict(DEFAULTS[family])
    if args.env in TARGETS:
        defaults["target"] = TARGETS[args.env]
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.target is None:
        ap.error(f"--target: no default for {args.env}; give the greedy mean return to reach")
    if args.quick:
        args.seeds, args.total_steps, args.throughput_steps = 2, 100_000, 50_000
    nps = [int(x) for x in args.nps.split(",") if x.strip()]
    seeds = list(range(args.seeds))
    py = None if args.no_peer else peer_python()
    script = "ppo_continuous_action.py" if family == "continuous" else "ppo.py"
    print(f"PPO {args.env}, CleanRL's {script} settings on both sides: time to a greedy "
          f"mean of {args.target:g} excluding evaluation (every {args.eval_every:,} steps, "
          f"{args.eval_episodes} episodes), at most {args.total_steps:,} env steps, seeds "
          f"{seeds}; {os.cpu_count()} cores, one run at a time", flush=True)
    print(f"peer: Stable-Baselines3 PPO via {py.relative_to(ROOT)}" if py else
          "peer: none (no python with stable_baselines3)", flush=True)
    ours = {f"pal_hpc -n {n}": n for n in nps}
    configs = list(ours) + ([PEER] if py else [])
    errors: list[str] = []
    target_flags = ["--total-steps", str(args.total_steps), "--target-return",
                    str(args.target), "--eval-every", str(args.eval_every),
                    "--eval-episodes", str(args.eval_episodes)]

    with tempfile.TemporaryDirectory(prefix="bench_ppo-") as tmp:
        def run_one(cfg: str, seed: int) -> dict:
            if cfg == PEER:
                return run_peer(py, ["target", "--env", args.env, "--seed", str(seed),
                                     "--total-steps",
                                     str(args.total_steps), "--target", str(args.target),
                                     "--eval-every", str(args.eval_every),
                                     "--eval-episodes", str(args.eval_episodes)], args.timeout)
            return run_ours(ours[cfg], args, Path(tmp) / f"{cfg[-1]}-{seed}",
                            "--seed", str(seed), *target_flags)

        records = ({c: {s: None for s in seeds} for c in configs} if args.throughput_only
                   else run_seeds(configs, seeds, run_one, TIME_KEY, errors, width=14))
        tp_configs = configs + ([CLEANRL] if args.cleanrl else [])
        samples: dict[str, list[float]] = {cfg: [] for cfg in tp_configs}
        for rep in range(args.repeats):
            for cfg in tp_configs:
                try:
                    if cfg == PEER:
                        rec = run_peer(py, ["throughput", "--env", args.env, "--steps",
                                            str(args.throughput_steps)], args.timeout)
                        rate = rec["env_steps_per_s"]
                    elif cfg == CLEANRL:
                        rate = run_cleanrl(args, args.throughput_steps,
                                           Path(tmp) / f"cleanrl-{rep}")
                    else:
                        rec = run_ours(ours[cfg], args, Path(tmp) / f"tp-{cfg[-1]}-{rep}",
                                       "--total-steps", str(args.throughput_steps),
                                       "--eval-every", "0", "--eval-episodes", "1")
                        t = rec["master_time"]
                        # The loop's wall time without the final evaluation and checkpoint.
                        rate = rec["env_steps"] / (t["wall_s"] * (1 - t["evaluation"]
                                                                  - t["checkpoint"]))
                    samples[cfg].append(rate)
                    print(f"  throughput {cfg:<14} {rate:10,.0f} env steps/s", flush=True)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    errors.append(f"{cfg} throughput: {exc}")
        rates = {cfg: statistics.median(v) if v else math.nan for cfg, v in samples.items()}

    med: dict[str, dict] = {}
    goal: dict[str, dict] = {}
    if not args.throughput_only:
        print(f"\nPPO {args.env}, seconds to target excl. evaluation (env steps), "
              f"target {args.target:g}")
        for cfg in configs:
            times = [reached(records[cfg][s], TIME_KEY) for s in seeds]
            steps = [reached(records[cfg][s], "steps_to_target") for s in seeds]
            med[cfg] = {"time": statistics.median(times), "steps": statistics.median(steps),
                        "reached": sum(not math.isinf(t) for t in times),
                        "times": times, "steps_list": steps}
        for cfg in configs:
            times, steps = med[cfg]["times"], med[cfg]["steps_list"]
            row = "".join(f"{fmt(t, '.1f'):>8} ({fmt(s, ',.0f'):>7})"
                          for t, s in zip(times, steps))
            col = "" if not py or cfg == PEER else \
                f"  SB3/ours {ratio(med[PEER]['time'], med[cfg]['time'])}"
            print(f"  {cfg:<14}{row}  median {fmt(med[cfg]['time'], '.1f')} s, "
                  f"{fmt(med[cfg]['steps'], ',.0f')} steps, reached "
                  f"{med[cfg]['reached']}/{len(seeds)}{col}")
    print(f"\nenv steps/s of the whole training loop ({args.throughput_steps:,} steps, "
          f"median of {args.repeats})")
    peers = [c for c in (PEER, CLEANRL) if c in rates and not math.isnan(rates[c])]
    for cfg in tp_configs:
        col = "" if cfg in (PEER, CLEANRL) or math.isnan(rates[cfg]) else "".join(
            f"  ours/{'SB3' if p == PEER else 'CleanRL'} {rates[cfg] / rates[p]:.2f}x"
            for p in peers)
        print(f"  {cfg:<14}{fmt(rates[cfg], ',.0f'):>10}{col}")
    if py and not args.throughput_only:
        for cfg in ours:
            p, o = med[PEER]["time"], med[cfg]["time"]
            speed = None if math.isinf(p) or math.isinf(o) else p / o
            goal[cfg] = {"speedup": speed, "met": speed is not None and speed >= GOAL}
            print(f"goal, {cfg} vs SB3 PPO: >= {GOAL:g}x on the median time to target "
                  f"({'n/a' if speed is None else f'{speed:.2f}x'}): "
                  f"{'MET' if goal[cfg]['met'] else 'NOT MET'}")
    if errors:
        print(f"{len(errors)} run(s) failed (see stderr): " + "; ".join(errors))
    if args.json:
        def enc(v):
            if isinstance(v, list):
                return [enc(x) for x in v]
            return None if isinstance(v, float) and not math.isfinite(v) else v

        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "seeds": [] if args.throughput_only else seeds, "total_steps": args.total_steps, "target": args.target,
            "runs": {c: {str(s): records[c][s] for s in seeds} for c in configs},
            "medians": {c: {k: enc(v) for k, v in med[c].items()} for c in configs},
            "env_steps_per_s": {c: enc(v) for c, v in rates.items()},
            "env_steps_per_s_samples": samples, "env": args.env,
            "goal": goal, "errors": errors}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
