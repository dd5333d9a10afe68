"""Prioritized-sampling trees side by side: pal_hpc's KSumTree, a plain numpy
binary sum tree, and (when `make bench-peers` installed them) cpprb, torchrl
and tianshou -- all timed in this one run on this machine.

Two operations, in microseconds per batch (median of several rounds):
  update   set `batch` priorities at random indices
  sample   draw `batch` proportional (stratified) indices and read their priorities

    python bench/bench_tree.py            # the full grid (about two minutes)
    python bench/bench_tree.py --quick    # a small grid, for a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from pal_hpc.replay import KSumTree, ReferenceSumTree, max_threads

ROOT = Path(__file__).resolve().parent.parent
PEER_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
# Index/priority pairs pre-generated for `update` and cycled through: about two
# million, the same as bench/peer_trees.py, so every batch touches fresh parts of
# the tree on both sides (reusing a few batches keeps them in cache and flatters).
POOL_ITEMS = 1 << 21


def time_op(fn, budget_s: float, rounds: int = 5) -> float:
    """Median microseconds per call of fn(i) over `rounds` rounds of ~budget_s each."""
    for i in range(3):
        fn(i)
    t0 = time.perf_counter()
    calls = 0
    while time.perf_counter() - t0 < budget_s / rounds / 4 or calls < 3:
        fn(calls)
        calls += 1
    per_call = (time.perf_counter() - t0) / calls
    n = max(3, int(budget_s / rounds / per_call))
    results = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for i in range(n):
            fn(i)
        results.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(results)


def measure_tree(tree, capacity: int, batch: int, budget_s: float, seed: int = 0) -> dict:
    """update and sample+get timings for a tree with the KSumTree interface."""
    rng = np.random.default_rng(seed)
    pool = max(1, POOL_ITEMS // batch)
    idx = rng.integers(0, capacity, (pool, batch))
    prio = rng.random((pool, batch)) + 0.001
    update = time_op(lambda i: tree.update(idx[i % pool], prio[i % pool]), budget_s)
    sample = time_op(lambda i: tree.get(tree.sample(batch, rng)), budget_s)
    return {"update": update, "sample": sample}


def filled(cls, capacity: int, **kw):
    tree = cls(capacity, **kw)
    tree.update(np.arange(capacity), np.random.default_rng(1).random(capacity) + 0.01)
    return tree


def run_peers(configs: list[dict], quick: bool) -> tuple[list[dict], str]:
    """Peer timings from the separate peer venv, or ([], reason)."""
    if not PEER_PYTHON.exists():
        return [], "no .venv-peers (run `make bench-peers` to compare with cpprb/torchrl/tianshou)"
    cmd = [str(PEER_PYTHON), str(ROOT / "bench" / "peer_trees.py"), "--configs", json.dumps(configs)]
    if quick:
        cmd += ["--min-time", "0.02"]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env, check=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        return [], f"peer run failed: {exc}\n{getattr(exc, 'stderr', '')}"
    return json.loads(out.stdout), ""


def fmt(x) -> str:
    return "-" if x is None else f"{x:9.2f}"


def ratio(peer, ours) -> str:
    return "    -" if peer is None or ours is None else f"{peer / ours:5.1f}x"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small grid and short timings (smoke run)")
    ap.add_argument("--no-peers", action="store_true", help="skip cpprb/torchrl/tianshou")
    ap.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1),
                    help="thread count for the 'all threads' rows (default: all cores)")
    ap.add_argument("--json", type=Path, help="also write every measurement to this file")
    args = ap.parse_args()

    budget = 0.05 if args.quick else 0.4
    caps = [2**16, 2**20] if args.quick else [2**16, 2**18, 2**20, 2**22]
    batches = [32, 256] if args.quick else [32, 256, 4096]
    fanouts = [2, 16, 64] if args.quick else [2, 4, 8, 16, 32, 64]
    records: list[dict] = []

    print(f"pal_hpc tree benchmark  (cores={os.cpu_count()}, OpenMP max threads={max_threads()}, "
          f"numpy {np.__version__})")
    configs = [{"capacity": c, "batch": b} for c in caps for b in batches]
    peers, why = ([], "skipped (--no-peers)") if args.no_peers else run_peers(configs, args.quick)
    if why:
        print(f"peers: {why}")
    peer_names = sorted({p["peer"] for p in peers})
    peer_at = {(p["peer"], p["op"], p["capacity"], p["batch"]): p["us_per_batch"] for p in peers}

    # 1. Capacity x batch, fanout 16, one thread, against numpy and the peers.
    print("\n[1] us per batch, one thread, KSumTree fanout 16; ratio = other / ours (higher: we are faster)")
    for op in ("update", "sample"):
        head = f"{op:>6} {'capacity':>9} {'batch':>5} {'pal_hpc':>9} {'numpy-bin':>9} {'ratio':>6}"
        for name in peer_names:
            head += f" {name:>9} {'ratio':>6}"
        print(head)
        for cap in caps:
            ours_tree = filled(KSumTree, cap, fanout=16)
            ref_tree = filled(ReferenceSumTree, cap, fanout=2)
            for b in batches:
                ours = measure_tree(ours_tree, cap, b, budget)[op]
                ref = measure_tree(ref_tree, cap, b, budget / 2)[op]
                records += [dict(impl="pal_hpc", op=op, capacity=cap, batch=b, fanout=16, threads=1, us=ours),
                            dict(impl="numpy-binary", op=op, capacity=cap, batch=b, threads=1, us=ref)]
                line = f"{'':>6} {cap:>9} {b:>5} {fmt(ours)} {fmt(ref)} {ratio(ref, ours)}"
                for name in peer_names:
                    theirs = peer_at.get((name, op, cap, b))
                    line += f" {fmt(theirs)} {ratio(theirs, ours)}"
                print(line, flush=True)

    # 2. Fanout sweep.
    cap, b = 2**20, 256
    print(f"\n[2] fanout sweep, capacity {cap}, batch {b}, one thread (us per batch)")
    print(f"{'fanout':>6} {'depth':>5} {'MiB':>6} {'update':>9} {'sample':>9}")
    for k in fanouts:
        tree = filled(KSumTree, cap, fanout=k)
        r = measure_tree(tree, cap, b, budget)
        records += [dict(impl="pal_hpc", op=op, capacity=cap, batch=b, fanout=k, threads=1, us=r[op])
                    for op in r]
        print(f"{k:>6} {tree.depth:>5} {KSumTree.nbytes(cap, k) / 2**20:6.1f} "
              f"{fmt(r['update'])} {fmt(r['sample'])}", flush=True)

    # 3. One thread against all threads (lookups are the OpenMP-parallel part).
    print(f"\n[3] threads, capacity {cap}, fanout 16: sample+get us per batch")
    tree = filled(KSumTree, cap, fanout=16)
    print(f"{'batch':>7} {'1 thread':>9} {f'{args.threads} threads':>10} {'speedup':>7}")
    for b in ([4096, 65536] if args.quick else [256, 4096, 65536]):
        tree.num_threads = 1
        one = measure_tree(tree, cap, b, budget)["sample"]
        tree.num_threads = args.threads
        many = measure_tree(tree, cap, b, budget)["sample"]
        tree.num_threads = 1
        records += [dict(impl="pal_hpc", op="sample", capacity=cap, batch=b, fanout=16, threads=t, us=u)
                    for t, u in ((1, one), (args.threads, many))]
        print(f"{b:>7} {fmt(one)} {fmt(many):>10} {one / many:6.2f}x", flush=True)

    # 4. The targets at capacity 2^20, batch 256, one thread.
    ours = {r["op"]: r["us"] for r in records
            if r["impl"] == "pal_hpc" and r["capacity"] == 2**20 and r["batch"] == 256
            and r.get("fanout") == 16 and r["threads"] == 1}
    print("\n[4] targets (capacity 2^20, batch 256, one thread)")
    sample_peers = {n: peer_at.get((n, "sample", 2**20, 256)) for n in peer_names}
    sample_peers = {n: v for n, v in sample_peers.items() if v is not None}
    if sample_peers:
        best = min(sample_peers, key=sample_peers.get)
        r = sample_peers[best] / ours["sample"]
        print(f"  sample: pal_hpc {ours['sample']:.2f} us vs fastest peer {best} "
              f"{sample_peers[best]:.2f} us -> {r:.2f}x (target >= 2x: {'met' if r >= 2 else 'NOT met'})")
    cpprb = peer_at.get(("cpprb", "update", 2**20, 256))
    if cpprb is not None:
        r = cpprb / ours["update"]
        print(f"  update: pal_hpc {ours['update']:.2f} us vs cpprb {cpprb:.2f} us -> {r:.2f}x "
              f"(target >= 2x: {'met' if r >= 2 else 'NOT met'})")
    if not sample_peers and cpprb is None:
        print(f"  pal_hpc sample {ours['sample']:.2f} us, update {ours['update']:.2f} us "
              f"(no peers to compare: `make bench-peers`)")

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"ours": records, "peers": peers}, indent=1))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
