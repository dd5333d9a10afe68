"""Lockstep environment stepping: pal_hpc's LockstepVectorEnv beside gymnasium's vector
envs, the reactor paper's Ray baseline and the native engines, on CartPole-v1 and
ALE/Pong-v5 (preprocessed: frameskip 4 max-pooled, 30 no-ops, 84x84 gray, 4 stacked).

For W workers and E environments per worker (N = W * E environments), steps/s of
random actions (one stream drawn up front, the same for every engine):

  lockstep  pal_hpc.envs.LockstepVectorEnv(N envs, num_workers=W), copy=True
  async     gymnasium AsyncVectorEnv(shared_memory=True): one process per env (N)
  sync      gymnasium SyncVectorEnv: the N envs in the calling process
  ray       the reactor paper's baseline (arXiv 2312.04704): one @ray.remote actor per
            environment, one ray.get per round (Ray from .venv-peers)
  envpool   envpool (C++ envs, num_threads=W): CartPole-v1 and Pong-v5 (.venv-peers)
  ale       ale-py's AtariVectorEnv (C++ preprocessing, num_threads=W): Pong only
  plain     one env in one process, a bare step/reset loop: the ceiling per core

Each measurement runs in its own process (bench/vecenv_worker.py): --warmup seconds
untimed, then --seconds timed.  Engines with one process per env (async, ray) are
skipped above --max-procs processes (memory).  Targets from the issue are checked and
printed: CartPole E=1 W=2: lockstep >= 5x async and >= 50x ray; E=32: >= 0.8x
min(W, cores) x plain; Pong: >= 10x ray, >= 0.9x min(W, cores) x plain, and within
1.5x of envpool.

    python bench/bench_lockstep.py [--seconds 2] [--workers 1,2,4] [--per-worker 1,8,32]
                                   [--envs cartpole,pong] [--json OUT]
    python bench/bench_lockstep.py --quick
    python bench/bench_lockstep.py --spread 5      # the issue's three rows, 5 runs each
    python bench/bench_lockstep.py --paper [--quick] [--workers 1,2] [--paper-envs ...]

--spread N measures the three rows the issue's held-out check names (CartPole W=2 E=1
vs async, CartPole W=2 E=16 vs sync -- 32 envs in one process --, Pong W=2 E=1 vs
plain) N times, alternating ours and the peer, and prints min / median / max of each
ratio: how much the rate depends on luck (where the master runs, how waits wake).

--paper measures only the reactor paper's simulation-throughput rows (arXiv 2312.04704;
bench/paper_sim_worker.py): 15 envs, random actions, one step of all 15 per round, on
CartPole-v1, Blackjack-v1, Pendulum-v1 and ALE Pong, MsPacman, SpaceInvaders with raw
RGB frames (plain gym.make("ALE/Pong-v5")) and preprocessed; LockstepVectorEnv with W
workers (--workers, default 1,2) beside the paper's Ray baseline (one @ray.remote actor
per env drawing its own action, one ray.get per round), each ratio beside the paper's
(1.21x on Gym, 11.6x on Atari).  The peer python is --peer-python, default
$PAL_PEER_PYTHON, else .venv-peers/bin/python.  Each row also measures one env stepped
bare in one process ("plain"): min(cores, 15) x that rate is what any engine can step
on this machine, so "ceiling/ray" is the largest ratio over Ray that this machine
allows; where it is below the paper's, the paper's ratio is out of reach here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEER_PYTHON = Path(os.environ.get("PAL_PEER_PYTHON",
                                   ROOT / ".venv-peers" / "bin" / "python"))
WORKER = ROOT / "bench" / "vecenv_worker.py"
PAPER_WORKER = ROOT / "bench" / "paper_sim_worker.py"
# The reactor paper's rows and its LF/Ray throughput ratios (arXiv 2312.04704: 1.21x on
# its Gym envs, 11.6x on its Atari envs, which it ran on raw frames).
PAPER_ENVS = ["cartpole", "blackjack", "pendulum", "pong", "mspacman", "spaceinvaders",
              "pong-pre", "mspacman-pre", "spaceinvaders-pre"]
PAPER_RATIO = {"gym": 1.21, "atari": 11.6}
PEER_ENGINES = {"ray", "envpool", "ale"}


def settle(seconds: float = 10.0) -> None:
    """Wait (up to `seconds`) until the previous measurement's processes are gone -- Ray's
    daemons take a few seconds to exit after its driver -- so they do not take cores
    from the next one."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        busy = subprocess.run(["pgrep", "-f", "ray::|raylet|gcs_server|vecenv_worker"],
                              capture_output=True, text=True).stdout.split()
        if not busy:
            return
        time.sleep(0.2)


def measure(engine: str, env: str, w: int, e: int, args) -> dict:
    """One bench/vecenv_worker.py run: W workers of E envs each."""
    return run_worker(engine, WORKER, ["--env", env, "--workers", str(w), "--per-worker",
                                       str(e)], args)


def run_worker(engine: str, script: Path, argv: list[str], args) -> dict:
    """Run `script --engine ENGINE ARGV --seconds --warmup` in its own process (the peer
    venv's python for peer engines) after the previous one's processes are gone; its
    last JSON line, or {"skipped": why}."""
    settle()
    python = Path(args.peer_python) if engine in PEER_ENGINES else Path(sys.executable)
    if not python.exists():
        return {"skipped": f"{python} missing (make bench-peers, or --peer-python)"}
    cmd = [str(python), str(script), "--engine", engine, *argv,
           "--seconds", str(args.seconds), "--warmup", str(args.warmup)]
    envvars = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
                   RAY_DEDUP_LOGS="0", RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=envvars, cwd=ROOT,
                             timeout=300 + 2 * (args.seconds + args.warmup))
    except subprocess.TimeoutExpired:
        return {"skipped": "timed out"}
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"skipped": f"failed (exit {out.returncode}): {out.stderr.strip()[-300:]}"}
    return json.loads(lines[-1])


def engines_for(env: str) -> list[str]:
    return ["lockstep", "async", "sync", "ray", "envpool"] + (["ale"] if env == "pong" else [])


def fmt_rate(rec: dict) -> str:
    return f"{rec['steps_per_s']:>10,.0f}" if "steps_per_s" in rec else f"{'--':>10}"


def ratio(ours: dict, peer: dict) -> float | None:
    if "steps_per_s" in ours and "steps_per_s" in peer and peer["steps_per_s"] > 0:
        return ours["steps_per_s"] / peer["steps_per_s"]
    return None


def fmt_ratio(r: float | None) -> str:
    return f"{r:>7.2f}x" if r is not None else f"{'--':>8}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--per-worker", default="1,8,32")
    p.add_argument("--envs", default="cartpole,pong")
    p.add_argument("--max-procs", type=int, default=32,
                   help="skip one-process-per-env engines above this many processes")
    p.add_argument("--quick", action="store_true", help="1 s runs, W in 1,2, E in 1,8")
    p.add_argument("--json", default="", help="also write every record to this file")
    p.add_argument("--peer-python", default=str(PEER_PYTHON),
                   help="python of the peer venv (default: $PAL_PEER_PYTHON, else "
                        ".venv-peers/bin/python)")
    p.add_argument("--paper", action="store_true",
                   help="only the reactor paper's rows: 15 envs, Gym and Atari (raw and "
                        "preprocessed), W in --workers (default 1,2) beside its Ray baseline")
    p.add_argument("--paper-envs", default=",".join(PAPER_ENVS),
                   help="with --paper: these of its envs")
    p.add_argument("--spread", type=int, default=0,
                   help="only the issue's three rows, measured this many times each, "
                        "with min/median/max of the ratios")
    args = p.parse_args()
    if args.paper:
        if args.workers == p.get_default("workers"):
            args.workers = "1,2"
        if args.quick:
            args.seconds, args.warmup = 1.0, 0.3
        return paper(args)
    if args.quick:
        args.seconds, args.warmup, args.workers, args.per_worker = 1.0, 0.3, "1,2", "1,8"
    workers = [int(x) for x in args.workers.split(",")]
    per_worker = [int(x) for x in args.per_worker.split(",")]
    cores = len(os.sched_getaffinity(0))
    print(f"bench_lockstep: {cores} cores; {args.seconds:g} s per measurement after "
          f"{args.warmup:g} s warm-up; steps/s are environment steps (a round of N envs = N)")
    records, failures = [], []
    if args.spread:
        return spread(args)

    for env in args.envs.split(","):
        plain = measure("plain", env, 1, 1, args)
        records.append(plain)
        print(f"\n== {env}: plain single-env loop {fmt_rate(plain).strip()} steps/s per core")
        header = "  W   E     N  " + "".join(f"{name:>11}" for name in engines_for(env))
        print(header + "   vs async   vs sync    vs ray  vs envpool" +
              ("    vs ale" if env == "pong" else "") + "  vs plain*min(W,cores)")
        for w in workers:
            for e in per_worker:
                n = w * e
                row = {}
                for engine in engines_for(env):
                    if engine in ("async", "ray") and n > args.max_procs:
                        row[engine] = {"skipped": f"more than --max-procs {args.max_procs} "
                                                  f"processes", "engine": engine, "env": env}
                        continue
                    row[engine] = measure(engine, env, w, e, args)
                    row[engine].update(engine=engine, env=env, workers=w, per_worker=e)
                    records.append(row[engine])
                ours = row["lockstep"]
                ceiling = {"steps_per_s": plain.get("steps_per_s", 0) * min(w, cores)} \
                    if "steps_per_s" in plain else {}
                rs = {k: ratio(ours, row[k]) for k in row if k != "lockstep"}
                rs["plain"] = ratio(ours, ceiling)
                line = f"{w:>3} {e:>3} {n:>5}  " + "".join(f"{fmt_rate(row[k]):>11}" for k in row)
                line += "".join(f"{fmt_ratio(rs.get(k)):>10}" for k in
                                ["async", "sync", "ray", "envpool"] + (["ale"] if env == "pong" else []))
                line += f"{fmt_ratio(rs['plain']):>12}"
                print(line, flush=True)
                for k, rec in row.items():
                    if "skipped" in rec and k == "lockstep":
                        failures.append(f"{env} W={w} E={e}: lockstep {rec['skipped']}")
                # the targets, where this row is one they name
                targets = []
                if env == "cartpole" and e == 1 and w == 2:
                    targets += [("vs async", rs.get("async"), 5.0), ("vs ray", rs.get("ray"), 50.0)]
                if env == "cartpole" and e == 32:
                    targets += [("vs min(W,cores) x plain", rs["plain"], 0.8)]
                if env == "pong":
                    targets += [("vs ray", rs.get("ray"), 10.0),
                                ("vs min(W,cores) x plain", rs["plain"], 0.9),
                                ("vs envpool", rs.get("envpool"), 1 / 1.5)]
                for name, r, want in targets:
                    if r is not None:
                        verdict = "met" if r >= want else "NOT met"
                        print(f"           target {name} >= {want:.2f}x: {r:.2f}x {verdict}")
        if "bytes_copied_per_step" in ours:
            print(f"  bytes copied per env step (lockstep, copy=True): "
                  f"{ours['bytes_copied_per_step']:,} B (observation into the shared batch "
                  f"and out of it, action in, reward and flags)")
        skipped = sorted({f"{r['engine']}: {r['skipped']}" for r in records
                          if "skipped" in r and r.get("env") == env})
        for s in skipped:
            print(f"  skipped {s}")

    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    for f in failures:
        print(f"FAILED {f}")
    return 1 if failures else 0


def paper(args) -> int:
    """The reactor paper's simulation-throughput rows: 15 envs, random actions, one step
    of all 15 per round; LockstepVectorEnv with each W of --workers beside the paper's Ray
    baseline (bench/paper_sim_worker.py), the ratio printed beside the paper's."""
    workers = [int(x) for x in args.workers.split(",")]
    envs = args.paper_envs.split(",")
    unknown = sorted(set(envs) - set(PAPER_ENVS))
    if unknown:
        raise SystemExit(f"--paper-envs: unknown {unknown}; expected some of {PAPER_ENVS}")
    cores = len(os.sched_getaffinity(0))
    print(f"bench_lockstep --paper: {cores} cores; {args.seconds:g} s per measurement after "
          f"{args.warmup:g} s warm-up; 15 envs, random actions, one step of all 15 per "
          f"round; steps/s are env steps (a round = 15)")
    print(f"  ours: LockstepVectorEnv(15 envs, num_workers=W), W in {workers}; ray: one "
          f"@ray.remote actor per env, one ray.get per round ({args.peer_python})")
    print(f"{'env':<18}" + "".join(f"{'W=' + str(w):>10}" for w in workers) + f"{'ray':>10}"
          + "".join(f"{'W=' + str(w) + '/ray':>10}" for w in workers)
          + f"{'plain':>10}{'ceil/ray':>10}     paper  best vs paper")
    records, failed = [], False
    for env in envs:
        kind = "gym" if env in ("cartpole", "blackjack", "pendulum") else "atari"
        base = ["--env", env, "--num-envs", "15"]
        ray = run_worker("ray", PAPER_WORKER, base, args)
        ours = [run_worker("lockstep", PAPER_WORKER, base + ["--workers", str(w)], args)
                for w in workers]
        plain = run_worker("plain", PAPER_WORKER, ["--env", env, "--num-envs", "1"], args)
        ceiling = ({"steps_per_s": min(cores, 15) * plain["steps_per_s"]}
                   if "steps_per_s" in plain else {})
        for rec, engine, w in [(ray, "ray", 0), (plain, "plain", 1)] + [
                (o, "lockstep", w) for o, w in zip(ours, workers)]:
            rec.update(engine=engine, env=env, workers=w, paper=True)
            records.append(rec)
            if engine == "lockstep" and "skipped" in rec:
                failed = True
        rs = [ratio(o, ray) for o in ours]
        best = max((r for r in rs if r is not None), default=None)
        want = PAPER_RATIO[kind]
        verdict = "--" if best is None else ("met" if best >= want else "NOT met")
        label = env + (" (raw)" if kind == "atari" and not env.endswith("-pre") else "")
        cap = ratio(ceiling, ray)
        if best is not None and best < want and cap is not None and cap < want:
            verdict += " (out of reach here)"
        print(f"{label:<18}" + "".join(f"{fmt_rate(o):>10}" for o in ours) +
              f"{fmt_rate(ray):>10}" + "".join(f"{fmt_ratio(r):>10}" for r in rs) +
              f"{fmt_rate(plain):>10}{fmt_ratio(cap):>10}"
              f"{want:>9.2f}x  {verdict}", flush=True)
        for rec in [ray, plain] + ours:
            if "skipped" in rec:
                print(f"  skipped {rec['engine']} W={rec['workers']}: {rec['skipped']}")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 1 if failed else 0


SPREAD_ROWS = [("cartpole", 2, 1, "async", "vs AsyncVectorEnv"),
               ("cartpole", 2, 16, "sync", "vs one process stepping the 32 envs"),
               ("pong", 2, 1, "plain", "vs one env (per core: x min(W, cores))")]


def spread(args) -> int:
    """The issue's three rows, `args.spread` times each; min/median/max of the ratios."""
    import statistics
    cores = len(os.sched_getaffinity(0))
    print(f"\n== spread over {args.spread} runs (ours and the peer alternate)")
    for env, w, e, peer, what in SPREAD_ROWS:
        ours, theirs, ratios = [], [], []
        for _ in range(args.spread):
            a = measure("lockstep", env, w, e, args)
            b = measure(peer, env, 1 if peer == "plain" else w, 1 if peer == "plain" else e, args)
            if "steps_per_s" not in a or "steps_per_s" not in b:
                print(f"  {env} W={w} E={e}: skipped ({a.get('skipped') or b.get('skipped')})")
                break
            scale = min(w, cores) if peer == "plain" else 1
            ours.append(a["steps_per_s"])
            theirs.append(b["steps_per_s"])
            ratios.append(a["steps_per_s"] / (b["steps_per_s"] * scale))
        if ratios:
            print(f"  {env:<8} W={w} E={e:<3} {what}: ratio min {min(ratios):.2f}x  median "
                  f"{statistics.median(ratios):.2f}x  max {max(ratios):.2f}x   (ours "
                  f"{min(ours):,.0f}..{max(ours):,.0f} steps/s, {peer} "
                  f"{min(theirs):,.0f}..{max(theirs):,.0f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
