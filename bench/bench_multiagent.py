"""Multi-agent inference in lockstep beside Ray: the reactor-model paper's experiment
(arXiv 2312.04704: ma-gym TrafficJunction10-v1, one policy per agent, each step the
joint observation to every agent's policy, the actions gathered, then env.step; 100,000
steps; Ray 917 s vs Lingua Franca 179 s, 5.12x, at 10 agents).

Both sides run the same setup in the same run (bench/ma_setup.py): MAgent2's battle
(PettingZoo parallel API) with 4 and with 10 agents, one MLP obs -> 64 -> 21 (argmax)
per agent, each its own weights; the same number of env steps.

  ours  pal_hpc.envs.LockstepAgents(env, policies, num_workers=W) for W in --workers:
        the env in this process, the agents' policies in W worker processes (W=0: all
        in this process, no handoff: the reference, not a lockstep row).  The run is
        `LockstepAgents.run(steps)`: workers started before the clock.
  ray   bench/peer_ray_multiagent.py in the peer venv: one @ray.remote actor per agent
        holding its policy, one call per live agent and a ray.get barrier per step
        (the paper's structure).  Actors constructed before the clock.

Prints steps/s of each and ours/Ray, with the issue's targets (>= 10x Ray at 10 agents,
>= 4x at 4 agents) checked on the best W >= 1.  The peer python is --peer-python,
default $PAL_PEER_PYTHON, else .venv-peers/bin/python (`make bench-peers`).

    python bench/bench_multiagent.py                 # 100,000 steps per row (the paper's)
    python bench/bench_multiagent.py --quick         # 1,000 steps per row
    python bench/bench_multiagent.py --agents 10 --steps 20000 --workers 1,2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from bench_lockstep import settle
from ma_setup import battle, policy_makers

ROOT = Path(__file__).resolve().parent.parent
PEER_PYTHON = Path(os.environ.get("PAL_PEER_PYTHON", ROOT / ".venv-peers" / "bin" / "python"))
TARGET = {10: 10.0, 4: 4.0}
PAPER = {10: 917 / 179}


def run_ours(agents: int, workers: int, steps: int, max_cycles: int) -> dict:
    """Steps/s of LockstepAgents(workers) on battle(agents)."""
    from pal_hpc.envs.lockstep_agents import LockstepAgents

    env = battle(agents, max_cycles)
    with LockstepAgents(env, policy_makers(env), num_workers=workers) as runner:
        res = runner.run(steps, seed=0)
    env.close()
    return {"steps_s": res["steps"] / res["seconds"], **res}


def run_ray(agents: int, steps: int, max_cycles: int, python: Path) -> dict:
    """Steps/s of the Ray baseline, or {"skipped": why}."""
    if not python.exists():
        return {"skipped": f"{python} missing (make bench-peers, or --peer-python)"}
    settle()
    cmd = [str(python), str(ROOT / "bench" / "peer_ray_multiagent.py"), "--agents",
           str(agents), "--steps", str(steps), "--max-cycles", str(max_cycles)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=7200)
    if proc.returncode != 0:
        return {"skipped": f"ray run failed: {proc.stderr[-1500:]}"}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    settle()
    return {"steps_s": res["steps"] / res["seconds"], **res}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", default="4,10", help="agent counts (even), comma-separated")
    ap.add_argument("--workers", default="0,1,2",
                    help="our worker processes per row (0: every policy in this process)")
    ap.add_argument("--steps", type=int, default=100_000, help="env steps per measurement")
    ap.add_argument("--max-cycles", type=int, default=1000, help="battle's episode length")
    ap.add_argument("--quick", action="store_true", help="1,000 steps per measurement")
    ap.add_argument("--peer-python", default=str(PEER_PYTHON),
                    help="python of the peer venv (default: $PAL_PEER_PYTHON, else "
                         ".venv-peers/bin/python)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    if args.quick:
        args.steps = 1_000
    counts = [int(a) for a in args.agents.split(",")]
    workers = [int(w) for w in args.workers.split(",")]
    print(f"multi-agent inference, MAgent2 battle, MLP obs->64->21 per agent, {args.steps:,} "
          f"steps per row; ours: LockstepAgents(num_workers=W); ray: one actor per agent, "
          f"ray.get per step ({args.peer_python}); {len(os.sched_getaffinity(0))} cores")
    cols = "".join(f"{f'W={w}':>10}" for w in workers)
    ratios = "".join(f"{f'W={w}/ray':>11}" for w in workers if w)
    print(f"{'agents':>6}{cols}{'ray':>10}{ratios}  target")
    rows = []
    for n in counts:
        ours = {w: run_ours(n, w, args.steps, args.max_cycles) for w in workers}
        ray = run_ray(n, args.steps, args.max_cycles, Path(args.peer_python))
        row = {"agents": n, "steps": args.steps,
               "ours": {w: r["steps_s"] for w, r in ours.items()},
               "ray": ray.get("steps_s"), "ray_skipped": ray.get("skipped")}
        line = f"{n:>6}" + "".join(f"{ours[w]['steps_s']:>10,.0f}" for w in workers)
        if ray.get("steps_s"):
            line += f"{ray['steps_s']:>10,.0f}"
            best = max((ours[w]["steps_s"] for w in workers if w), default=0.0)
            row["ratio"] = {w: ours[w]["steps_s"] / ray["steps_s"] for w in workers if w}
            line += "".join(f"{row['ratio'][w]:>10.1f}x" for w in workers if w)
            want = TARGET.get(n)
            if want:
                met = "met" if best / ray["steps_s"] >= want else "NOT met"
                line += f"  >= {want:g}x: {met}"
            if n in PAPER:
                line += f" (paper: {PAPER[n]:.2f}x)"
        else:
            line += f"  ray skipped: {ray['skipped'][:200]}"
        print(line, flush=True)
        rows.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
