"""Time to solve, continuous control: TD3 and SAC on Pendulum-v1 under `mpiexec -n N`
(N = 1, 2, 4) beside Stable-Baselines3's TD3 and SAC with rl-baselines3-zoo's
Pendulum-v1 hyperparameters (bench/peer_sb3_continuous.py, run in .venv-peers when it
has stable_baselines3), seeds 0..K-1, one run at a time.

Both sides use one protocol: up to --total-steps env steps (40k); every --eval-every
(2000) env steps a deterministic-policy evaluation, the mean return of --eval-episodes
(10) episodes on fresh environments seeded as pal_hpc seeds them (seed + 10**6 + env
steps + i; a final evaluation after the last step, seed + 2 * 10**6, counts too); the
run stops at the first evaluation whose mean reaches --target (-200).  Wall-clock to
the target runs from the start of training (after setup) to the end of that
evaluation, MINUS the time spent evaluating up to it, on both sides (pal_hpc's
`time_to_target_excl_eval_s`; the peer's field of the same name): SB3's evaluation
runs inline in its one process, pal_hpc's on an actor rank, so excluding it compares
training alone.  torch uses one thread per process on both sides.

Hyperparameters.  SB3 gets the zoo's (see bench/peer_sb3_continuous.py).  pal_hpc runs
its td3/sac defaults, which follow the same entries -- td3: gamma 0.98, batch 256,
learning_starts 10k, replay 200k, hidden [400, 300], Adam 1e-3 for actor and critic,
action noise 0.1, 10k random steps, policy delay 2, target noise 0.2 clipped at 0.5,
tau 0.005; sac: batch 256, learning_starts 100, replay 1e6, hidden [256, 256], gamma
0.99, tau 0.005, automatic temperature with target entropy -|A|, 100 random steps --
plus `--lr 1e-3` for sac (pal_hpc's sac default is 3e-4; the zoo's Pendulum entry
uses 1e-3).  replay_ratio 256 with batch 256 is one gradient step per env step,
SB3's train_freq 1 / gradient_steps 1, summed over all actors.  What still differs:
  - replay: pal_hpc samples prioritized (alpha 0.6, beta 0.4 -> 1), SB3 uniformly;
    n_step is 1 on both sides.
  - actors: pal_hpc at -n 2 / -n 4 has 1 / 3 actor ranks of 4 environments each
    (-n 1: one rank that acts and learns); SB3 steps one environment.  TD3's
    exploration std is spread Ape-X style over actors (actor i of N: 0.1 * (1 + i /
    (N-1)), so 0.1 to 0.2); with one actor it is 0.1 as in the zoo.  The learner's
    updates are paced to the replay ratio, not interleaved step by step, so an
    actor's policy lags the learner by up to --publish-every (10) updates.
  - evaluation: both on fresh environments seeded alike, but pal_hpc evaluates when
    its shared step counter passes a multiple of --eval-every (a few steps later at
    -n > 1), SB3 exactly at the multiple.
  - the action space: pal_hpc rescales Pendulum's [-2, 2] to [-1, 1] with a
    gymnasium wrapper; SB3 does the same inside its policy.

Per algorithm and configuration the tables show each seed's time and steps to the
target, the median over seeds, how many seeds reached it, and SB3's median / ours
(above 1: pal_hpc is faster, or needed fewer env steps).  A seed that did not reach the
target (or whose run failed) enters the median as +infinity.  Then the conservative
ratio, SB3's fastest seed / our median, and the goal check for -n 4: at least 3x
faster than SB3 by median and by the conservative ratio, with no more than 1.2x SB3's
median env steps to the target, and the scaling check: every configuration of more
than one rank at least 1.6x sooner than -n 1 (issue 37's goal).  An --nps entry N/L runs -n N with L learners per node
(`--learners-per-node L`), so one run can set the default layout and a split batch
over several learners side by side: `--nps 1,4,4/2`; Ns runs N solo ranks
(`--ranks-per-node 1`: each rank a virtual node that acts into its own replay and
learns, the N learners splitting the batch): `--nps 1,2,2s`.

Ceiling.  --ceiling also measures, in the same run, what the cores allow per update:
our update on the whole batch (256 rows) and on a share of 2 learners (128), each by
one process alone and by one per core at once (bench/profile_learner.py), and SB3's
model.train() per gradient step (bench/profile_sb3.py).  From those: -n 1's learner
alone, 2 learners splitting the batch on their own cores with a reduction that costs
nothing (the ceiling of -n 2 solo and of 2 learners), and every core updating on the
whole batch (the ceiling only a free split of one update could reach).  Each
configuration's measured wall time per update (its runs' learner_profile) is printed
as a fraction of its ceiling, which separates the layout's speed from the number of
updates it needed to reach the target.

    python bench/bench_continuous.py [--seeds 5] [--nps 1,2,2s,4,4/2] [--algos td3,sac] [--pal-flags FLAGS] [--ceiling] [--json OUT]
    python bench/bench_continuous.py --quick    # smoke run: 1 seed, -n 4, 20k steps
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
from to_target import (ROOT, fmt, peer_available, peer_banner, ratio, reached, sb3_python,
                       run_peer_script, run_seeds, tail)

TIME_KEY = "time_to_target_excl_eval_s"
# Flags that bring pal_hpc's defaults to the zoo's Pendulum-v1 entry (see the docstring).
OURS_FLAGS = {"td3": [], "sac": ["--lr", "1e-3"]}
BATCH = 256             # td3's and sac's batch here (their run defaults, the zoo's)
GOAL_SPEEDUP = 3.0      # -n 4 at least this much faster than SB3 ...
GOAL_STEPS = 1.2        # ... with at most this many times SB3's env steps to the target
GOAL_NP = 4
GOAL_SCALING = 1.6      # -n 4 at least this much sooner than -n 1


SOLO = 0                # a learner count that means: every rank a node of its own


def parse_nps(text: str) -> list[tuple[int, int | None]]:
    """'1,4,4/2,2s' -> [(1, None), (4, None), (4, 2), (2, SOLO)]: rank count, learners
    per node (None: the default layout; SOLO: `--ranks-per-node 1`, every rank a
    virtual node of its own that acts and learns, the learners averaging gradients)."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        if item.endswith("s"):
            out.append((int(item[:-1]), SOLO))
            continue
        n, _, learners = item.partition("/")
        out.append((int(n), int(learners) if learners else None))
    return out


def config_name(n: int, learners: int | None) -> str:
    if learners == SOLO:
        return f"pal_hpc -n {n} solo"
    return f"pal_hpc -n {n}" + (f" L{learners}" if learners else "")


def parse_config(cfg: str) -> tuple[int, int | None]:
    """The inverse of config_name."""
    words = cfg.split()
    if len(words) > 3 and words[3] == "solo":
        return int(words[2]), SOLO
    return int(words[2]), (int(words[3][1:]) if len(words) > 3 else None)


def layout_flags(learners: int | None) -> list[str]:
    if learners == SOLO:
        return ["--ranks-per-node", "1"]
    return ["--learners-per-node", str(learners)] if learners else []


def peer_name(algo: str) -> str:
    return f"sb3-{algo}"


def run_ours(algo: str, np_: int, learners: int | None, seed: int, args, run_dir: Path) -> dict:
    layout = layout_flags(learners)
    cmd = pal_main(np_, "--algo", algo, "--env", args.env, "--seed", str(seed), *layout,
           "--total-steps", str(args.total_steps), "--target-return", str(args.target),
           "--eval-every", str(args.eval_every), "--eval-episodes", str(args.eval_episodes),
           "--run-dir", str(run_dir), "--progress-every", "1000", *OURS_FLAGS[algo],
           *args.pal_flags.split())
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=mpi_env(),
                         cwd=ROOT)
    summary = run_dir / "summary.json"
    if out.returncode != 0 or not summary.exists():
        raise RuntimeError(f"exit {out.returncode}: {tail(out.stderr or out.stdout)}")
    return json.loads(summary.read_text())


def run_peer(algo: str, seed: int, args) -> dict:
    return run_peer_script("peer_sb3_continuous.py", [
        "--algo", algo, "--seed", str(seed), "--env", args.env,
        "--total-steps", str(args.total_steps), "--target", str(args.target),
        "--eval-every", str(args.eval_every), "--eval-episodes", str(args.eval_episodes)],
        args.timeout)


def div(a: float, b: float) -> float | None:
    """a / b, None when either side did not reach the target."""
    return None if math.isinf(a) or math.isinf(b) else a / b


def run_algo(algo: str, configs: list[str], seeds: list[int], args, tmp: Path,
             errors: list[str]) -> dict[str, dict[int, dict | None]]:
    """Every (seed, config) run of one algorithm (`to_target.run_seeds`)."""
    peer = peer_name(algo)

    def run_one(cfg: str, seed: int) -> dict:
        if cfg == peer:
            return run_peer(algo, seed, args)
        n, learners = parse_config(cfg)
        # One run directory per configuration (td3-n2solo-seed0): "-n 2" and "-n 2
        # solo" must not meet.
        name = cfg.removeprefix("pal_hpc ").replace(" ", "")
        return run_ours(algo, n, learners, seed, args, tmp / f"{algo}{name}-seed{seed}")

    return run_seeds(configs, seeds, run_one, TIME_KEY, errors, label=f"{algo} ", width=18)


def summarize(records: dict, configs: list[str], seeds: list[int]) -> dict:
    medians = {}
    for cfg in configs:
        times = [reached(records[cfg][s], TIME_KEY) for s in seeds]
        steps = [reached(records[cfg][s], "steps_to_target") for s in seeds]
        medians[cfg] = {"time": statistics.median(times), "steps": statistics.median(steps),
                        "times": times, "steps_list": steps,
                        "reached": sum(not math.isinf(t) for t in times)}
    return medians


def print_tables(algo: str, medians: dict, configs: list[str], seeds: list[int], args,
                 has_peer: bool) -> dict | None:
    """The two tables, the conservative ratio and the goal check; returns the goal
    check's figures (None without the peer or without -n 4)."""
    peer = peer_name(algo)
    for title, key, each, spec in (("wall-clock to target excl. evaluation (s)", "time",
                                    "times", ".1f"),
                                   ("env steps to target", "steps", "steps_list", ",.0f")):
        print(f"\n{algo.upper()} {args.env}, {title}, target {args.target:g}")
        head = "".join(f"{'seed ' + str(s):>10}" for s in seeds)
        peer_col = f"{'SB3/ours':>10}" if has_peer else ""
        print(f"  {'config':<18}{head}{'median':>10}{'reached':>9}{peer_col}")
        for cfg in configs:
            m = medians[cfg]
            row = "".join(f"{fmt(v, spec):>10}" for v in m[each])
            col = ""
            if has_peer:
                col = f"{'':>10}" if cfg == peer else f"{ratio(medians[peer][key], m[key]):>10}"
            hits = f"{m['reached']}/{len(seeds)}"
            print(f"  {cfg:<18}{row}{fmt(m[key], spec):>10}{hits:>9}{col}")
    scaling_goals(algo, medians, configs)
    if not has_peer:
        return None
    best = min(medians[peer]["times"])
    print(f"conservative, SB3's fastest seed ({fmt(best, '.1f')} s) / our median: " + ", ".join(
        f"{c.replace('pal_hpc ', '')} {ratio(best, medians[c]['time'])}"
        for c in configs if c != peer))
    goals = {}
    show = lambda v, s: "n/a" if v is None else format(v, s)  # noqa: E731
    for ours in (c for c in configs if c != peer and parse_config(c)[0] == GOAL_NP):
        m, p = medians[ours], medians[peer]
        speed, conservative = div(p["time"], m["time"]), div(best, m["time"])
        steps = div(m["steps"], p["steps"])  # ours / SB3's: the goal bounds it from above
        met = (speed is not None and conservative is not None and steps is not None
               and speed >= GOAL_SPEEDUP and conservative >= GOAL_SPEEDUP
               and steps <= GOAL_STEPS)
        print(f"goal, {ours.replace('pal_hpc ', '')} vs SB3 {algo.upper()}: >= "
              f"{GOAL_SPEEDUP:g}x faster (median {show(speed, '.2f')}x, conservative "
              f"{show(conservative, '.2f')}x) with env steps <= {GOAL_STEPS:g}x SB3's "
              f"(ours/SB3 {show(steps, '.2f')}x): {'MET' if met else 'NOT MET'}")
        goals[ours] = {"speedup_median": speed, "speedup_conservative": conservative,
                       "steps_ours_over_sb3": steps, "met": met}
    return goals or None


def scaling_goals(algo: str, medians: dict, configs: list[str]) -> None:
    """Each configuration of more than one rank: its median time against -n 1's (the
    1.6x goal)."""
    one = next((c for c in configs if c.startswith("pal_hpc") and parse_config(c) == (1, None)),
               None)
    if one is None:
        return
    for cfg in (c for c in configs if c.startswith("pal_hpc") and parse_config(c)[0] > 1):
        speed = div(medians[one]["time"], medians[cfg]["time"])
        verdict = "n/a" if speed is None else f"{speed:.2f}x: " + (
            "MET" if speed >= GOAL_SCALING else "NOT MET")
        print(f"scaling, {algo.upper()} {cfg.replace('pal_hpc ', '')} vs -n 1: >= "
              f"{GOAL_SCALING:g}x sooner (median over median) {verdict}")


def profile_ours(algo: str, batch: int, copies: int, timeout: float = 600) -> list[float]:
    """Seconds per update of `algo` on `batch` rows (bench/profile_learner.py, one torch
    thread, best of 3 rounds), measured by `copies` processes at once: [each one's]."""
    with tempfile.TemporaryDirectory(prefix="bench_continuous-ceiling-") as tmp:
        outs = [Path(tmp) / f"{i}.json" for i in range(copies)]
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        procs = [subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "profile_learner.py"), "--algo", algo,
             "--batch", str(batch), "--iters", "900", "--rounds", "3", "--json", str(o)],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for o in outs]
        for proc in procs:
            _, err = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                raise RuntimeError(f"profile_learner.py: exit {proc.returncode}: {tail(err)}")
        return [json.loads(o.read_text())["fp32"]["total"] for o in outs]


def profile_sb3(algo: str, timeout: float = 600) -> float | None:
    """SB3's model.train() seconds per gradient step (bench/profile_sb3.py), or None
    without SB3."""
    py = sb3_python()
    if py is None:
        return None
    with tempfile.TemporaryDirectory(prefix="bench_continuous-ceiling-") as tmp:
        out = Path(tmp) / "sb3.json"
        proc = subprocess.run([str(py), str(ROOT / "bench" / "profile_sb3.py"), "--algo", algo,
                               "--rounds", "3", "--json", str(out)], cwd=ROOT, timeout=timeout,
                              capture_output=True, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
        if proc.returncode != 0:
            raise RuntimeError(f"profile_sb3.py: exit {proc.returncode}: {tail(proc.stderr)}")
        return json.loads(out.read_text())["train_per_step_s"]


def measure_ceiling(algo: str, with_peer: bool) -> dict:
    """What the cores allow TD3/SAC per update, measured now: one learner's update on
    the whole batch and on each of 2 learners' shares, by one process alone and by one
    per core at once, and SB3's update.  See print_ceiling."""
    cores = os.cpu_count() or 1
    share = math.ceil(BATCH / 2)
    print(f"  ceiling: {algo} per-update costs (profile_learner.py, {BATCH} and {share} "
          f"rows, alone and {cores} at once{'; profile_sb3.py' if with_peer else ''}) ...",
          flush=True)
    c = {"batch": BATCH, "share": share, "cores": cores,
         "full_solo": profile_ours(algo, BATCH, 1)[0],
         "share_solo": profile_ours(algo, share, 1)[0],
         "full_loaded": profile_ours(algo, BATCH, cores),
         "share_loaded": profile_ours(algo, share, min(2, cores)),
         "sb3_train": profile_sb3(algo) if with_peer else None}
    c["rate_one"] = 1 / c["full_solo"]                    # -n 1's learner, alone
    # Two learners splitting the batch, each on a core at its loaded cost, the reduction
    # free: the most updates/s the -n 2 layouts (solo or 2 learners) can give.
    c["rate_split"] = 1 / statistics.mean(c["share_loaded"])
    # Every core updating on the whole batch: what the cores give if an update split
    # into equal parts at no cost at all (the issue's "2x" ceiling).
    c["rate_cores"] = sum(1 / t for t in c["full_loaded"])
    return c


def wall_per_update(rec: dict | None) -> float:
    """A run's mean learner wall time per update (s; its summary's learner_profile),
    +inf without one."""
    profs = [p for p in (rec or {}).get("learner_profile") or [] if p.get("wall_per_update")]
    return statistics.mean(p["wall_per_update"] for p in profs) / 1e3 if profs else math.inf


def print_ceiling(algo: str, c: dict, records: dict, medians: dict, configs: list[str],
                  seeds: list[int]) -> dict:
    """The ceiling block: the measured costs, the most updates/s they allow, and each
    configuration's measured updates/s (median of its runs' wall per update) as a
    fraction of them."""
    ms = lambda t: f"{t * 1e3:.2f}"  # noqa: E731
    loaded = lambda ts: "/".join(ms(t) for t in ts)  # noqa: E731
    print(f"\n{algo.upper()} ceiling (measured in this run; ms per update, one torch thread): "
          f"{c['batch']} rows {ms(c['full_solo'])} alone, {loaded(c['full_loaded'])} with "
          f"{c['cores']} at once; {c['share']} rows (a share of 2 learners) "
          f"{ms(c['share_solo'])} alone, {loaded(c['share_loaded'])} at once"
          + (f"; SB3 train() {ms(c['sb3_train'])}" if c["sb3_train"] else ""))
    one = c["rate_one"]
    print(f"  updates/s at most: -n 1 {one:.1f}; 2 learners of {c['share']} rows "
          f"{c['rate_split']:.1f} ({c['rate_split'] / one:.2f}x -n 1, a free reduction); "
          f"the cores' sum at {c['batch']} rows {c['rate_cores']:.1f} ({c['rate_cores'] / one:.2f}x, "
          f"an update split at no cost)"
          + (f"; SB3 {1 / c['sb3_train']:.1f}: the split's ceiling is "
             f"{c['rate_split'] * c['sb3_train']:.2f}x SB3's rate" if c["sb3_train"] else ""))
    out = {}
    for cfg in (x for x in configs if x.startswith("pal_hpc")):
        per = statistics.median(wall_per_update(records[cfg][s]) for s in seeds)
        if math.isinf(per):
            continue
        n, learners = parse_config(cfg)
        # The default split has 1 learner per 4 ranks: one learner up to -n 7.
        count = n if learners == SOLO else learners or max(1, n // 4)
        cap = (c["rate_one"] if n == 1 else 1 / statistics.mean(c["full_loaded"]) if count == 1
               else c["rate_split"] if count == 2 else c["rate_cores"])
        out[cfg] = {"wall_per_update_s": per, "fraction_of_ceiling": (1 / per) / cap}
        print(f"  {cfg.replace('pal_hpc ', ''):<10} measured {ms(per)} ms a update "
              f"(median of the runs' learner wall), {1 / per:.1f} updates/s: "
              f"{(1 / per) / cap:.0%} of its ceiling ({cap:.1f}), {(1 / per) / one:.2f}x "
              f"-n 1's ceiling")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5,
                    help="run seeds 0..K-1 (5: a median of 3 is one lucky or unlucky seed "
                         "away from a different answer)")
    ap.add_argument("--nps", default="1,2,4", help="comma-separated mpiexec -n values; N/L: "
                    "L learners per node, Ns: N solo ranks (--ranks-per-node 1)")
    ap.add_argument("--algos", default="td3,sac", help="comma-separated: td3, sac")
    ap.add_argument("--env", default="Pendulum-v1")
    ap.add_argument("--total-steps", type=int, default=40_000)
    ap.add_argument("--target", type=float, default=-200.0)
    ap.add_argument("--eval-every", type=int, default=2_000)
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--no-peer", action="store_true", help="skip Stable-Baselines3")
    ap.add_argument("--pal-flags", default="", metavar="'FLAGS'",
                    help="extra flags for pal_hpc's runs, e.g. '--learners-per-node 2'")
    ap.add_argument("--ceiling", action="store_true",
                    help="also measure, in the same run, the per-update costs the cores allow "
                         "(ours alone and one per core at once, whole batch and 2 learners' "
                         "shares; SB3's) and print each configuration as a fraction of them")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 seed, -n 4 only, 20000 steps")
    ap.add_argument("--json", type=Path, help="also write every run's record to this file "
                                              "(rewritten after each algorithm)")
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.nps, args.total_steps = 1, "4", 20_000
    try:
        nps = parse_nps(args.nps)
    except ValueError:
        ap.error(f"--nps: comma-separated N, N/L (ranks / learners per node) or Ns (N solo "
                 f"ranks), got {args.nps!r}")
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    if args.seeds < 1 or not nps or min(n for n, _ in nps) < 1 or \
            any(lrn not in (None, SOLO) and not 1 <= lrn < n for n, lrn in nps):
        ap.error("--seeds and every --nps value must be >= 1, and a learner count L in "
                 "N/L between 1 and N - 1")
    if not algos or any(a not in OURS_FLAGS for a in algos):
        ap.error(f"--algos: choose from {', '.join(OURS_FLAGS)}")
    seeds = list(range(args.seeds))
    sb3 = None if args.no_peer else peer_available()

    print(f"{'/'.join(a.upper() for a in algos)} {args.env}: time to a greedy mean return "
          f"of {args.target:g} excluding evaluation time (eval every {args.eval_every:,} "
          f"steps, {args.eval_episodes} episodes), at most {args.total_steps:,} env steps, "
          f"seeds {seeds}; {os.cpu_count()} cores, one run at a time", flush=True)
    peer_banner(sb3, args.no_peer, "TD3/SAC, rl-baselines3-zoo Pendulum-v1 "
                                   "hyperparameters (bench/peer_sb3_continuous.py)")

    out = {"env": args.env, "target": args.target, "total_steps": args.total_steps,
           "eval_every": args.eval_every, "eval_episodes": args.eval_episodes,
           "time_key": TIME_KEY, "seeds": seeds, "nps": args.nps, "cores": os.cpu_count(),
           "sb3_version": sb3, "algos": {}, "errors": []}
    errors: list[str] = out["errors"]
    enc = lambda v: None if math.isinf(v) else v  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="bench_continuous-") as tmp:
        for algo in algos:
            configs = [config_name(n, lrn) for n, lrn in nps] + ([peer_name(algo)] if sb3 else [])
            records = run_algo(algo, configs, seeds, args, Path(tmp), errors)
            medians = summarize(records, configs, seeds)
            goal = print_tables(algo, medians, configs, seeds, args, bool(sb3))
            ceiling = measured = None
            if args.ceiling:
                ceiling = measure_ceiling(algo, bool(sb3))
                measured = print_ceiling(algo, ceiling, records, medians, configs, seeds)
            peer = peer_name(algo)
            out["algos"][algo] = {
                "ours_flags": OURS_FLAGS[algo],
                "runs": {c: {str(s): records[c][s] for s in seeds} for c in configs},
                "medians": {c: {TIME_KEY: enc(medians[c]["time"]),
                                "steps_to_target": enc(medians[c]["steps"]),
                                "reached": medians[c]["reached"], "of": len(seeds)}
                            for c in configs},
                "ratios_sb3_over_ours": ({c: {k: div(medians[peer][k], medians[c][k])
                                              for k in ("time", "steps")}
                                          for c in configs if c != peer} if sb3 else None),
                "sb3_fastest_over_our_median": ({c: div(min(medians[peer]["times"]),
                                                        medians[c]["time"])
                                                 for c in configs if c != peer}
                                                if sb3 else None),
                "goal": goal, "ceiling": ceiling, "per_update": measured}
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(out, indent=1))
    print("\nnot reached ('-') counts as +inf in the median; SB3/ours > 1: pal_hpc is faster "
          "(or used fewer env steps); 'ours only' / 'SB3 only': only that side's median "
          "reached the target")
    if errors:
        print(f"{len(errors)} run(s) failed (see stderr); they count as not reached")
    return 0


if __name__ == "__main__":
    sys.exit(main())
