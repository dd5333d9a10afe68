"""Synchronized parallel Q-learning beside Ray: the reactor-model paper's experiment
(arXiv 2312.04704, Sec. 5: Ray 136.95 s vs Lingua Franca 94.22 s to round 500 at
batch 500 on their machine), with pal_hpc's `--schedule sync` as our side.

Both sides run the same setup, in the same run, on this machine: DQN on Blackjack-v1
(the observation tuple as 3 floats), a 3-32-2 MLP, Adam lr 0.01, gamma 0.99, MSE loss,
no gradient clipping, plain (not double) Q targets, target sync every 10 rounds; 16
workers each taking 100 epsilon-greedy (0.1) steps a round; a replay of the last 20,000
transitions sampled uniformly; one gradient step a round on a batch of 500, 1000 and
2000; 500 rounds.

  ours  mpiexec -n RANKS python -m mpi4py -m pal_hpc.main --schedule sync --per-alpha 0
        ...: ACTOR_RANKS actor ranks x (16 / ACTOR_RANKS) envs + 1 learner (default
        -n 3: 2 actor ranks x 8 envs, one actor rank per core of this 2-core machine;
        --actor-ranks 16 gives the paper's one process per worker, -n 17).  Time: the
        run's wall_s (summary.json), from the first round to the end, the final
        checkpoint included.
  ray   bench/peer_ray_sync_q.py in .venv-peers: 16 @ray.remote rollout actors, a
        remote replay actor, one ray.get barrier per round, the update on the driver
        (the paper's structure).  Time: the first round's calls to the last round's end
        (actors constructed before).

Both sides' start-up (MPI ranks + imports; ray.init + actors) is printed apart.  The
learned greedy policies are evaluated here, by one evaluator, on the same 10,000 hands.

The ceiling, measured in the same run: the round's env steps are the work no engine
can skip, so `rounds x 1,600` Blackjack steps at the rate this machine's cores step
them at once -- one bare loop per core (`make_env("Blackjack-v1")`, random actions,
resets included), all started together -- is the shortest time any engine could take.
The table prints it, Ray's time over it (the most any engine could be faster than
Ray here) and ours as a fraction of it.

    python bench/bench_sync_q.py                     # batches 500,1000,2000, 500 rounds
    python bench/bench_sync_q.py --quick             # batch 500, 50 rounds, 1,000 hands
    python bench/bench_sync_q.py --batches 500 --actor-ranks 16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PEER_PY = ROOT / ".venv-peers" / "bin" / "python"
WORKERS, STEPS = 16, 100


def ours_flags(batch: int, rounds: int, actor_ranks: int, run_dir: Path) -> list[str]:
    """pal_hpc's flags for the paper's setup (see the module docstring)."""
    envs = WORKERS // actor_ranks
    return ["--algo", "dqn", "--env", "Blackjack-v1", "--schedule", "sync",
            "--actors-per-node", str(actor_ranks), "--learners-per-node", "1",
            "--envs-per-actor", str(envs), "--round-steps", str(STEPS * envs),
            "--round-updates", "1", "--total-steps", str(rounds * WORKERS * STEPS),
            "--batch-size", str(batch), "--replay-capacity", "20000", "--per-alpha", "0",
            "--learning-starts", "1", "--n-step", "1", "--gamma", "0.99",
            "--hidden", "32", "--lr", "0.01", "--loss", "mse", "--no-double-q",
            "--grad-clip", "0", "--target-update", "10", "--eps-start", "0.1",
            "--eps-final", "0.1", "--eps-spread", "0", "--exploration-steps", "0",
            "--eval-every", "0", "--eval-episodes", "1", "--no-checkpoint-replay",
            "--progress-every", "60", "--run-dir", str(run_dir), "--overwrite"]


def run_ours(batch: int, rounds: int, actor_ranks: int, tmp: Path) -> tuple[dict, list]:
    """One pal_hpc run; (its times, its final online layers as (W, b) pairs)."""
    from pal_hpc.cluster.launch import mpi_env, pal_main

    run_dir = tmp / f"ours-{batch}"
    cmd = pal_main(actor_ranks + 1, *ours_flags(batch, rounds, actor_ranks, run_dir))
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True,
                          timeout=3600)
    total = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"pal_hpc run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return ({"wall_s": summary["wall_s"], "setup_s": total - summary["wall_s"],
             "updates": summary["updates"]}, our_layers(summary["checkpoint"]))


def our_layers(path: str) -> list:
    """The online network's (weight, bias) pairs from a pal_hpc checkpoint."""
    import h5py
    from torch import nn

    from pal_hpc.algos.dqn import DQN, DQNConfig
    from pal_hpc.envs import make_env
    from pal_hpc.io.checkpoint import load_tree

    env = make_env("Blackjack-v1", 0)
    algo = DQN(env.observation_space, env.action_space, DQNConfig(hidden=[32]), seed=0)
    with h5py.File(path, "r") as f:
        algo.load_state_dict(load_tree(f["algo"]))
    return [(m.weight.detach().numpy(), m.bias.detach().numpy())
            for m in algo.online.modules() if isinstance(m, nn.Linear)]


def run_ray(batch: int, rounds: int, tmp: Path) -> tuple[dict, list]:
    out = tmp / f"ray-{batch}.npz"
    t0 = time.monotonic()
    proc = subprocess.run([str(PEER_PY), str(ROOT / "bench" / "peer_ray_sync_q.py"),
                           "--batch", str(batch), "--rounds", str(rounds), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=3600)
    total = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"Ray run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    w = np.load(out)
    res["setup_s"] = total - res["wall_s"]
    return res, [(w["fc1.weight"], w["fc1.bias"]), (w["fc2.weight"], w["fc2.bias"])]


def greedy_return(layers: list, hands: int, seed: int = 777_000) -> float:
    """Mean return of the greedy policy of an MLP (ReLU between `layers`) over `hands`
    Blackjack-v1 hands, hand i dealt from reset(seed=seed + i): the same hands for
    every policy."""
    import gymnasium as gym

    env = gym.make("Blackjack-v1")
    total = 0.0
    for i in range(hands):
        obs, _ = env.reset(seed=seed + i)
        done = False
        while not done:
            z = np.asarray(obs, np.float32)
            for k, (w, b) in enumerate(layers):
                z = w @ z + b
                if k < len(layers) - 1:
                    z = np.maximum(z, 0)
            obs, r, term, trunc, _ = env.step(int(np.argmax(z)))
            total += r
            done = term or trunc
    return total / hands


def bare_rate(steps: int) -> float:
    """Blackjack-v1 env steps a second of one bare loop: random actions, resets."""
    from pal_hpc.envs import make_env

    env = make_env("Blackjack-v1", 0)
    env.reset(seed=0)
    actions = np.random.default_rng(0).integers(0, 2, steps)
    t0 = time.perf_counter()
    for a in actions:
        _, _, terminated, truncated, _ = env.step(int(a))
        if terminated or truncated:
            env.reset()
    return steps / (time.perf_counter() - t0)


def ceiling_s(rounds: int, steps: int = 100_000) -> tuple[float, float]:
    """(the ceiling's seconds for `rounds`, the cores' summed steps/s): one bare loop
    per core, started together (see the module docstring)."""
    procs = [subprocess.Popen([sys.executable, __file__, "--bare-rate", str(steps)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
             for _ in range(os.cpu_count() or 1)]
    rate = sum(float(p.communicate(timeout=600)[0]) for p in procs)
    return rounds * WORKERS * STEPS / rate, rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="500,1000,2000")
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--hands", type=int, default=10_000)
    ap.add_argument("--actor-ranks", type=int, default=2, choices=(1, 2, 4, 8, 16))
    ap.add_argument("--quick", action="store_true", help="batch 500, 50 rounds, 1,000 hands")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--bare-rate", type=int, help=argparse.SUPPRESS)  # ceiling_s's loops
    args = ap.parse_args()
    if args.bare_rate:
        print(bare_rate(args.bare_rate))
        return
    if args.quick:
        args.batches, args.rounds, args.hands = "500", 50, 1_000
    if not PEER_PY.exists():
        sys.exit(f"{PEER_PY} is missing: run `make bench-peers` first")
    print(f"synchronized parallel Q-learning, Blackjack-v1, {WORKERS} workers x {STEPS} "
          f"steps/round, {args.rounds} rounds; ours: -n {args.actor_ranks + 1} "
          f"({args.actor_ranks} actor ranks x {WORKERS // args.actor_ranks} envs + 1 "
          f"learner); ray: {WORKERS} actors; {os.cpu_count()} cores")
    ceiling, rate = ceiling_s(args.rounds)
    print(f"ceiling: {args.rounds * WORKERS * STEPS:,} Blackjack steps at {rate:,.0f}/s "
          f"({os.cpu_count()} bare loops at once) = {ceiling:.2f} s")
    print(f"{'batch':>6} {'ray s':>8} {'ours s':>8} {'ray/ours':>9} {'ray/ceil':>9} "
          f"{'ours of ceil':>12} {'ray setup':>10} {'ours setup':>11} {'ray return':>11} "
          f"{'ours return':>12}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_sync_q_") as tmp:
        for batch in (int(b) for b in args.batches.split(",")):
            ray_res, ray_layers = run_ray(batch, args.rounds, Path(tmp))
            ours, our_net = run_ours(batch, args.rounds, args.actor_ranks, Path(tmp))
            row = {"batch": batch, "ray_s": ray_res["wall_s"], "ours_s": ours["wall_s"],
                   "ratio": ray_res["wall_s"] / ours["wall_s"],
                   "ray_setup_s": ray_res["setup_s"], "ours_setup_s": ours["setup_s"],
                   "ray_return": greedy_return(ray_layers, args.hands),
                   "ours_return": greedy_return(our_net, args.hands),
                   "ours_updates": ours["updates"], "rounds": args.rounds,
                   "hands": args.hands, "actor_ranks": args.actor_ranks,
                   "ceiling_s": ceiling, "ceiling_rate": rate}
            rows.append(row)
            print(f"{batch:>6} {row['ray_s']:>8.2f} {row['ours_s']:>8.2f} "
                  f"{row['ratio']:>8.2f}x {row['ray_s'] / ceiling:>8.2f}x "
                  f"{ceiling / row['ours_s']:>12.0%} {row['ray_setup_s']:>10.1f} "
                  f"{row['ours_setup_s']:>11.1f} {row['ray_return']:>11.4f} "
                  f"{row['ours_return']:>12.4f}", flush=True)
    print("target (issue 37): ray/ours >= 2.2x at batch 500, ours' return no worse than "
          "ray's (paper: Lingua Franca 1.45x Ray at batch 500)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
