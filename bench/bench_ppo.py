"""PPO: pal_hpc's --algo ppo beside Stable-Baselines3's PPO with the same
hyperparameters (CleanRL's: bench/peer_sb3_ppo.py lists them as SB3 arguments), both
sides in this one run, one run at a time.  CartPole-v1 (the default) takes ppo.py's
settings; a Box-action env (--env Hopper-v4, with the mujoco package: `make
install-mujoco`) ppo_continuous_action.py's, observation and reward normalization
included; an Atari id (--env ALE/Pong-v5: the "atari" family, image observations)
ppo_atari.py's: 8 envs, 128 steps a round, 4 minibatches, 4 epochs, lr 2.5e-4 annealed,
clip 0.1 (value clip too), ent_coef 0.01, the Nature CNN shared by both heads, rewards
clipped to their sign; throughput only (--throughput-only), since reaching a score on
Pong takes hours on this CPU.

1. Time to target, seeds 0..K-1: up to --total-steps (CleanRL's: CartPole 500k, MuJoCo
   1M) env steps, a greedy evaluation (--eval-episodes 10 episodes on fresh environments
   seeded seed + 10**6 + env steps + i) each time the step counter first reaches a
   multiple of --eval-every (10k; MuJoCo 50k), stop at the first whose mean reaches
   --target (CartPole 475, Hopper 1,500).  The time is `time_to_target_excl_eval_s` on
   both sides: from the start of training to that evaluation, minus the time spent
   evaluating.  A seed that did not get there counts as +infinity in the median.
2. Throughput: env steps per second of the whole training loop (stepping, acting,
   updates; no evaluation) over --throughput-steps env steps (100k; MuJoCo 50k; Atari
   20k: about 20 rounds of 1,024 steps, a few minutes a side here), the median of
   --repeats runs a side (1), interleaved; with --cleanrl DIR CleanRL's own script
   (ppo.py, ppo_continuous_action.py or ppo_atari.py from that checkout, in
   .venv-cleanrl: bash bench/install_cleanrl.sh) joins these rows with the SPS it
   prints.  --throughput-only skips part 1.  SB3's Atari rate leaves its first round
   out (bench/peer_sb3_ppo.py); ours and CleanRL's count from their loop's start.
   CleanRL's ppo_atari.py plays the v4 NoFrameskip game (CLEANRL_ENV_IDS: ALE/Pong-v5
   -> PongNoFrameskip-v4, the game its published numbers are on) with its own
   wrappers (no sticky actions, FIRE on reset), ours and SB3 the v5 game with
   AtariPreprocessing.  --sb3-vec subproc steps SB3's envs in a SubprocVecEnv
   (default dummy: in-process, as CleanRL's SyncVectorEnv).

--nps: comma-separated entries, each `mpiexec -n N` of ours: `N` (the family's envs,
on one node's ranks), or `Ns`: N data-parallel masters (--ranks-per-node 1), the
family's envs split over them (--num-envs E/N: `2s` on Atari is two learners of 4 envs
each, CleanRL's 8 in all); `/bf16` after an entry runs it with --precision bf16
(`--nps 1,2s,2s/bf16`).  --pal-flags "..." appends flags to every run of ours.
--ceiling measures the machine's ceiling in the same run (bench/profile_onpolicy.py: the
env step, the act and the update per env step, by one process alone and by one per
core at once) and prints each of our rates as a fraction of it.

The goal (issue 36): at least 2x SB3 on the median time to target.

    python bench/bench_ppo.py [--seeds 5] [--nps 1] [--json OUT]
    python bench/bench_ppo.py --env Hopper-v4 --seeds 3 --cleanrl ~/cleanrl/cleanrl
    python bench/bench_ppo.py --quick        # 2 seeds, 100k steps
    python bench/bench_ppo.py --env ALE/Pong-v5 --throughput-only --nps 1,2s,2s/bf16 \\
        --ceiling --cleanrl ~/cleanrl/cleanrl
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pal_hpc.algos.ppo.config import env_family
from pal_hpc.cluster.launch import mpi_env, pal_main
from to_target import ROOT, fmt, ratio, reached, run_seeds, sb3_python, tail

TIME_KEY = "time_to_target_excl_eval_s"
PEER = "sb3-ppo"
GOAL = 2.0
# Per family (pal_hpc's env_family): the run's length (CleanRL's total_timesteps), the
# greedy target, the evaluation cadence, and the throughput run's length.
# The target of a continuous env other than these is --target.  Atari: throughput only.
DEFAULTS = {
    "discrete": {"total_steps": 500_000, "target": 475.0, "eval_every": 10_000,
                 "throughput_steps": 100_000},
    "continuous": {"total_steps": 1_000_000, "eval_every": 50_000,
                   "throughput_steps": 50_000},
    "atari": {"throughput_steps": 20_000},
}
TARGETS = {"Hopper-v4": 1500.0, "Hopper-v5": 1500.0}
# CleanRL's script per family, and its num_envs (pal_hpc's default for the family).
SCRIPTS = {"discrete": "ppo.py", "continuous": "ppo_continuous_action.py",
           "atari": "ppo_atari.py"}
NUM_ENVS = {"discrete": 4, "continuous": 1, "atari": 8}
# The id ppo_atari.py gets for ours (it wraps the v4 NoFrameskip game with its own
# preprocessing, the game of CleanRL's published numbers); other ids go as given.
CLEANRL_ENV_IDS = {"ALE/Pong-v5": "PongNoFrameskip-v4",
                   "ALE/Breakout-v5": "BreakoutNoFrameskip-v4"}


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
    """CleanRL's own script for the family (SCRIPTS) from the checkout `args.cleanrl`,
    in .venv-cleanrl (bench/install_cleanrl.sh), for `steps` env steps on the CPU with
    one torch thread: the SPS it prints last ("SPS: 144", its global step over the
    seconds since its loop began; no evaluation in between).  The checkout's root goes
    on PYTHONPATH (ppo_atari.py imports cleanrl_utils); Atari ids map by
    CLEANRL_ENV_IDS."""
    script = args.cleanrl / SCRIPTS[args.family]
    env_id = CLEANRL_ENV_IDS.get(args.env, args.env)
    workdir.mkdir(parents=True, exist_ok=True)        # it writes runs/ into its cwd
    path = os.pathsep.join(filter(None, [str(args.cleanrl.parent),
                                         os.environ.get("PYTHONPATH")]))
    out = subprocess.run([str(CLEANRL_PYTHON), str(script), "--env-id", env_id,
                          "--total-timesteps", str(steps), "--no-cuda", "--seed", "0"],
                         capture_output=True, text=True, timeout=args.timeout, cwd=workdir,
                         env=dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                                  PYTHONPATH=path))
    sps = [line.split()[-1] for line in out.stdout.splitlines() if line.startswith("SPS:")]
    if out.returncode != 0 or not sps:
        raise RuntimeError(f"exit {out.returncode}: {tail(out.stderr or out.stdout)}")
    return float(sps[-1])


PRECISIONS = ("fp32", "bf16")


def parse_nps(text: str, family: str) -> dict[str, tuple[int, list[str]]]:
    """--nps entries -> {row name: (mpiexec -n, extra flags)}: `N`, or `Ns` for N
    masters of --num-envs NUM_ENVS[family] / N each (--ranks-per-node 1), either
    with `/bf16` or `/fp32` for --precision."""
    ours = {}
    for entry in (x.strip() for x in text.split(",")):
        if not entry:
            continue
        layout, _, precision = entry.partition("/")
        if precision and precision not in PRECISIONS:
            raise ValueError(f"--nps {entry}: the precision after / is fp32 or bf16")
        split = layout.endswith("s")
        digits = layout[:-1] if split else layout
        n = int(digits) if digits.isdigit() else 0
        if n < 1:
            raise ValueError(f"--nps {entry}: an entry is N or Ns with N >= 1, and "
                             f"/fp32 or /bf16 after it")
        flags = ["--precision", precision] if precision else []
        if split:
            envs = NUM_ENVS[family]
            if envs % n:
                raise ValueError(f"--nps {entry}: the {family} family's {envs} envs do "
                                 f"not split over {n} masters")
            flags += ["--ranks-per-node", "1", "--num-envs", str(envs // n)]
        ours[f"pal_hpc -n {entry}"] = (n, flags)
    return ours


def run_ours(cfg: tuple[int, list[str]], args, run_dir: Path, *flags: str) -> dict:
    np_, extra = cfg
    cmd = pal_main(np_, "--algo", "ppo", "--env", args.env, "--run-dir", str(run_dir),
                   "--progress-every", "1000", *extra, *flags, *args.pal_flags)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                         env=mpi_env(), cwd=ROOT)
    summary = run_dir / "summary.json"
    if out.returncode != 0 or not summary.exists():
        raise RuntimeError(f"exit {out.returncode}: {tail(out.stderr or out.stdout)}")
    return json.loads(summary.read_text())


def slug(cfg: str) -> str:
    """A row name's entry as a folder name: "pal_hpc -n 2s/bf16" -> "2s-bf16"."""
    return cfg.split()[-1].replace("/", "-")


def precision_of(cfg: tuple[int, list[str]], args) -> str:
    """The --precision a run of ours has (its entry's, else --pal-flags', else fp32)."""
    flags, precision = [*cfg[1], *args.pal_flags], "fp32"
    for flag, value in zip(flags, flags[1:]):
        if flag == "--precision":
            precision = value             # the last one given wins, as argparse's
    return precision


def measure_ceiling(args, ours: dict) -> dict:
    """bench/profile_onpolicy.py's ceiling for args.env at the precisions our rows use, with
    every core loaded (measured now, between the runs)."""
    from profile_onpolicy import ceiling

    precisions = sorted({precision_of(c, args) for c in ours.values()})
    print(f"  ceiling: measuring PPO's per-step costs ({', '.join(precisions)}) ...",
          flush=True)
    return ceiling(args.env, precisions, rounds=2, env_steps=3000,
                   cores=os.cpu_count() or 1)


def report_ceiling(ceil: dict) -> str:
    from profile_onpolicy import report

    return report(ceil)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="CartPole-v1",
                    help="CartPole-v1 (ppo.py's settings), a Box-action env such as "
                         "Hopper-v4 (ppo_continuous_action.py's; needs the mujoco package: "
                         "make install-mujoco) or an Atari id such as ALE/Pong-v5 "
                         "(ppo_atari.py's; --throughput-only)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--nps", default="1",
                    help="comma-separated mpiexec -n values of ours; Ns = N masters "
                         "(--ranks-per-node 1) splitting the family's envs")
    ap.add_argument("--pal-flags", default="", metavar="FLAGS",
                    help='extra flags for every run of ours, e.g. "--precision bf16"')
    ap.add_argument("--total-steps", type=int, help="default: the family's (below)")
    ap.add_argument("--target", type=float, help="default: the family's (below)")
    ap.add_argument("--eval-every", type=int, help="default: the family's (below)")
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--throughput-steps", type=int, help="default: the family's (below)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--sb3-vec", choices=("dummy", "subproc"), default="dummy",
                    help="SB3's throughput runs: DummyVecEnv (CleanRL's SyncVectorEnv) "
                         "or SubprocVecEnv")
    ap.add_argument("--cleanrl", type=Path, metavar="DIR",
                    help="a checkout's cleanrl/ folder (github.com/vwxyzjn/cleanrl): its "
                         "PPO script joins the throughput rows, run in .venv-cleanrl "
                         "(bash bench/install_cleanrl.sh)")
    ap.add_argument("--throughput-only", action="store_true",
                    help="skip the time to target")
    ap.add_argument("--repeats", type=int, default=1,
                    help="throughput runs per side, interleaved; the median is printed")
    ap.add_argument("--ceiling", action="store_true",
                    help="also measure the machine's ceiling for PPO on this env "
                         "(bench/profile_onpolicy.py: both sides' per-step costs, all cores "
                         "loaded) and print each of our rates as a fraction of it")
    ap.add_argument("--quick", action="store_true", help="2 seeds, 100k steps")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    family = args.family = env_family(args.env)
    if args.cleanrl:
        args.cleanrl = args.cleanrl.expanduser().resolve()    # its runs use another cwd
    script = SCRIPTS[family]
    if family == "atari" and not args.throughput_only:
        ap.error(f"{args.env}: time to target is not supported for Atari (hours of "
                 f"training a side on this CPU); give --throughput-only")
    if args.cleanrl and not (CLEANRL_PYTHON.exists() and (args.cleanrl / script).exists()):
        ap.error(f"--cleanrl {args.cleanrl}: needs its {script} there and "
                 f"{CLEANRL_PYTHON.relative_to(ROOT)} (bash bench/install_cleanrl.sh)")
    if args.cleanrl and family == "atari" and not (
            args.cleanrl.parent / "cleanrl_utils").is_dir():
        ap.error(f"--cleanrl {args.cleanrl}: ppo_atari.py needs the checkout's "
                 f"cleanrl_utils/ beside it")
    args.pal_flags = shlex.split(args.pal_flags)
    try:
        ours = parse_nps(args.nps, family)
    except ValueError as exc:
        ap.error(str(exc))
    defaults = dict(DEFAULTS[family])
    if args.env in TARGETS:
        defaults["target"] = TARGETS[args.env]
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.target is None and not args.throughput_only:
        ap.error(f"--target: no default for {args.env}; give the greedy mean return to reach")
    if args.quick:
        args.seeds, args.total_steps, args.throughput_steps = 2, 100_000, 50_000
    seeds = list(range(args.seeds))
    py = None if args.no_peer else sb3_python()
    print(f"PPO {args.env}, CleanRL's {script} settings on every side: " + (
          f"throughput only, {args.throughput_steps:,} env steps" if args.throughput_only
          else f"time to a greedy mean of {args.target:g} excluding evaluation (every "
               f"{args.eval_every:,} steps, {args.eval_episodes} episodes), at most "
               f"{args.total_steps:,} env steps, seeds {seeds}") +
          f"; {os.cpu_count()} cores, one run at a time", flush=True)
    print(f"peer: Stable-Baselines3 PPO via {py.relative_to(ROOT)}" if py else
          "peer: none (" + ("--no-peer" if args.no_peer
                            else "no python with stable_baselines3") + ")", flush=True)
    if args.pal_flags:
        print(f"ours with {shlex.join(args.pal_flags)}", flush=True)
    configs = list(ours) + ([PEER] if py else [])
    width = max(14, *(len(c) for c in configs))
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
            return run_ours(ours[cfg], args, Path(tmp) / f"{slug(cfg)}-{seed}",
                            "--seed", str(seed), *target_flags)

        records = ({c: {s: None for s in seeds} for c in configs} if args.throughput_only
                   else run_seeds(configs, seeds, run_one, TIME_KEY, errors, width=width))
        tp_configs = configs + ([CLEANRL] if args.cleanrl else [])
        samples: dict[str, list[float]] = {cfg: [] for cfg in tp_configs}
        for rep in range(args.repeats):
            for cfg in tp_configs:
                try:
                    if cfg == PEER:
                        rec = run_peer(py, ["throughput", "--env", args.env, "--steps",
                                            str(args.throughput_steps), "--vec",
                                            args.sb3_vec], args.timeout)
                        rate = rec["env_steps_per_s"]
                    elif cfg == CLEANRL:
                        rate = run_cleanrl(args, args.throughput_steps,
                                           Path(tmp) / f"cleanrl-{rep}")
                    else:
                        rec = run_ours(ours[cfg], args, Path(tmp) / f"tp-{slug(cfg)}-{rep}",
                                       "--total-steps", str(args.throughput_steps),
                                       "--eval-every", "0", "--eval-episodes", "1")
                        t = rec["master_time"]
                        # The loop's wall time without the final evaluation and checkpoint.
                        rate = rec["env_steps"] / (t["wall_s"] * (1 - t["evaluation"]
                                                                  - t["checkpoint"]))
                    samples[cfg].append(rate)
                    print(f"  throughput {cfg:<{width}} {rate:10,.0f} env steps/s", flush=True)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    errors.append(f"{cfg} throughput: {exc}")
        rates = {cfg: statistics.median(v) if v else math.nan for cfg, v in samples.items()}
        ceil = measure_ceiling(args, ours) if args.ceiling else None

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
            print(f"  {cfg:<{width}}{row}  median {fmt(med[cfg]['time'], '.1f')} s, "
                  f"{fmt(med[cfg]['steps'], ',.0f')} steps, reached "
                  f"{med[cfg]['reached']}/{len(seeds)}{col}")
    print(f"\nenv steps/s of the whole training loop ({args.throughput_steps:,} steps, "
          f"median of {args.repeats})")
    peers = [c for c in (PEER, CLEANRL) if c in rates and not math.isnan(rates[c])]
    for cfg in tp_configs:
        col = "" if cfg in (PEER, CLEANRL) or math.isnan(rates[cfg]) else "".join(
            f"  ours/{'SB3' if p == PEER else 'CleanRL'} {rates[cfg] / rates[p]:.2f}x"
            for p in peers)
        if ceil and cfg in ours:
            c = ceil[precision_of(ours[cfg], args)]["ceiling_loaded"]
            col += f"  {rates[cfg] / c:.0%} of the {ceil['cores']}-core ceiling {c:,.0f}"
        print(f"  {cfg:<{width}}{fmt(rates[cfg], ',.0f'):>10}{col}")
    if ceil:
        print(report_ceiling(ceil))
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
            "runs": {} if args.throughput_only else
                    {c: {str(s): records[c][s] for s in seeds} for c in configs},
            "medians": {c: {k: enc(v) for k, v in med[c].items()} for c in med},
            "env_steps_per_s": {c: enc(v) for c, v in rates.items()},
            "env_steps_per_s_samples": samples, "env": args.env,
            "nps": args.nps, "pal_flags": args.pal_flags, "sb3_vec": args.sb3_vec,
            "goal": goal, "ceiling": ceil, "errors": errors}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
