"""Across hosts, measured: what the network between hosts costs pal_hpc, beside the
same ranks on one host, in one run (root: test hosts as namespaces, see
docs/multihost.md).

1. The gradient Allreduce: 2 learners polling an Iallreduce of F float32 as the
   runtime's learners do (pal_hpc.plan.probe.measure_sync, the planner's own probe),
   one per test host (TCP over the veth links) against both on one test host (MPICH's
   shared memory), for gradients the size of DQN's CartPole MLP, TD3's [400, 300] actor
   and critic, and DQN's Nature CNN.
2. The off-policy loop: DQN on CartPole-v1, 4 ranks for --wall seconds, as 2 hosts x 2
   ranks against 1 host cut into 2 virtual nodes of 2 ranks (`--ranks-per-node 2`: the
   same roles, one replay per node, but one memory); updates/s and inserts (env
   steps)/s from each run's summary.

The test hosts share this machine's cores (here 2): what the rows show is the cost of
the network path (TCP, the link, the kernel's copies) against shared memory, not more
compute.  Ratio = 2 hosts / 1 host (time: > 1 costs; rates: < 1 costs).

    python bench/bench_multihost.py [--wall 20] [--reps 20]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Parameters (= gradient floats): 4-64-64-2; TD3's twin critics 4-400-300-1 (its
# critic phase); conv 8x8/4 32, 4x4/2 64, 3x3/1 64, fc 512, 6 actions.
SIZES = {"DQN CartPole MLP [64, 64]": 4_610, "TD3 [400, 300] twin critics": 245_202,
         "DQN Nature CNN (Pong)": 1_687_206}


def worker(floats: int, reps: int) -> None:
    """Under mpiexec -n 2: rank 0 prints the median seconds of one Allreduce."""
    from mpi4py import MPI

    from pal_hpc.plan.probe import measure_sync

    out = measure_sync(MPI.COMM_WORLD, [2], floats, reps=reps)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps({"seconds": out[2]}), flush=True)


def _run(cmd: list[str], timeout: float) -> str:
    from pal_hpc.cluster.launch import mpi_env

    res = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True,
                         timeout=timeout)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])} ... failed ({res.returncode}):\n"
                         f"{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    return res.stdout


def allreduce_rows(hosts, reps: int) -> list[dict]:
    rows = []
    for name, floats in SIZES.items():
        me = [sys.executable, __file__, "--worker", str(floats), "--reps", str(reps)]
        two = json.loads(_run(hosts.mpiexec_argv(2, me, ppn=1, hosts=hosts.names[:2]),
                              300).splitlines()[-1])["seconds"]
        one = json.loads(_run(hosts.mpiexec_argv(2, me, ppn=2, hosts=hosts.names[:1]),
                              300).splitlines()[-1])["seconds"]
        rows.append({"what": name, "floats": floats, "one_host_ms": one * 1e3,
                     "two_hosts_ms": two * 1e3, "ratio": two / one})
    return rows


def loop_rows(hosts, wall: float, out: Path) -> list[dict]:
    flags = ["--env", "CartPole-v1", "--total-steps", "100000000", "--wall-time", str(wall),
             "--eval-every", "0", "--eval-episodes", "1", "--learners-per-node", "1",
             "--progress-every", "5"]
    py = [sys.executable, "-m", "mpi4py", "-m", "pal_hpc.main"]
    rows = []
    for label, argv, on in (
            ("1 host, 2 virtual nodes x 2 ranks", [*flags, "--ranks-per-node", "2"],
             hosts.names[:1]),
            ("2 hosts x 2 ranks", flags, hosts.names[:2])):
        run_dir = out / label.split(",")[0].replace(" ", "_")
        t0 = time.monotonic()
        _run(hosts.mpiexec_argv(4, [*py, *argv, "--run-dir", str(run_dir)], ppn=4 // len(on),
                                hosts=on), wall + 300)
        s = json.loads((run_dir / "summary.json").read_text())
        rows.append({"layout": label, "nodes": s["nodes"], "hosts": s["hosts"],
                     "wall_s": s["wall_s"], "updates_per_s": s["updates"] / s["wall_s"],
                     "inserts_per_s": s["env_steps"] / s["wall_s"],
                     "run_s": time.monotonic() - t0})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wall", type=float, default=20.0, help="seconds per training run")
    ap.add_argument("--reps", type=int, default=20, help="Allreduces timed per size")
    ap.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.reps)
        return 0
    from pal_hpc.cluster.testhosts import TestHosts, unavailable

    why = unavailable()
    if why:
        print(f"bench_multihost: skipped: {why}")
        return 0
    with TestHosts(2, tag="b") as hosts, tempfile.TemporaryDirectory() as tmp:
        print(f"bench_multihost: 2 test hosts {hosts.names} (namespaces sharing this "
              f"machine's cores)")
        print(f"{'gradient Allreduce, 2 learners':<34} {'floats':>10} {'1 host ms':>10} "
              f"{'2 hosts ms':>11} {'ratio':>6}")
        for r in allreduce_rows(hosts, args.reps):
            print(f"{r['what']:<34} {r['floats']:>10,} {r['one_host_ms']:>10.3f} "
                  f"{r['two_hosts_ms']:>11.3f} {r['ratio']:>6.2f}")
        rows = loop_rows(hosts, args.wall, Path(tmp))
        print(f"\n{'DQN CartPole, 4 ranks, ' + str(int(args.wall)) + ' s':<36} "
              f"{'updates/s':>10} {'inserts/s':>10}")
        for r in rows:
            print(f"{r['layout']:<36} {r['updates_per_s']:>10,.0f} {r['inserts_per_s']:>10,.0f}")
        one, two = rows
        print(f"{'ratio (2 hosts / 1 host)':<36} "
              f"{two['updates_per_s'] / one['updates_per_s']:>10.2f} "
              f"{two['inserts_per_s'] / one['inserts_per_s']:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
