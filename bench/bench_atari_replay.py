"""Atari replay memory and sampling: bytes per transition and the time of
sample(32) with stacks (4, 84, 84) + importance weights on a full buffer of Pong
frames, ours (FrameStackReplay: one frame per slot, K-ary PER) beside SB3's
ReplayBuffer(optimize_memory_usage=True), cpprb's PrioritizedReplayBuffer
(next_of + stack_compress) and torchrl's prioritized buffer (run in .venv-peers by
bench/peer_atari_replay.py, same frames, same fill).

    python bench/bench_atari_replay.py               # 1M transitions (~7 GB each side)
    python bench/bench_atari_replay.py --quick       # 50k, for a check that it runs
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from atari_frames import EPISODE, frames, rss_bytes
from pal_hpc.replay import FrameStackReplay
from pal_hpc.runtime.nstep import transition_spec

HERE = Path(__file__).resolve().parent
PEER_PY = HERE.parent / ".venv-peers/bin/python"


def ours(capacity, pong, reps):
    base = rss_bytes()
    rb = FrameStackReplay(transition_spec((4, 84, 84), np.uint8, frame_stack=True), capacity,
                          n_step=3)
    chunk = 500
    t = 0
    while t < capacity:
        n = min(chunk, capacity - t)
        idx = (t + np.arange(n)) % len(pong)
        pos = (t + np.arange(n)) % (EPISODE + 1)
        k = np.where(pos == EPISODE, 0, np.minimum(3, EPISODE - pos)).astype(np.int64)
        rb.add(0, {"obs": pong[idx], "action": np.zeros(n, np.int64),
                   "reward": np.zeros(n, np.float32), "discount": np.ones(n, np.float32),
                   "nstep": k, "episode_start": pos == 0})
        t += n
    rss = rss_bytes() - base
    rng = np.random.default_rng(0)
    for _ in range(20):
        rb.sample(32, rng=rng)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        rb.sample(32, beta=0.4, rng=rng)
        times.append(time.perf_counter() - t0)
    return {"name": "pal_hpc FrameStackReplay", "bytes_per_transition": rb.nbytes / capacity,
            "rss_per_transition": rss / capacity, "sample32_us": 1e6 * float(np.median(times)),
            "threads": rb.sample_threads}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true", help="50k transitions, fewer repeats")
    ap.add_argument("--reps", type=int, default=500)
    ap.add_argument("--peers", default="sb3,cpprb,torchrl")
    args = ap.parse_args()
    cap = 50_000 if args.quick else args.capacity
    reps = 100 if args.quick else args.reps
    cache = HERE / ".pong_frames.npy"
    pong = frames(cache)
    rows = [ours(cap, pong, reps)]
    for peer in [p for p in args.peers.split(",") if p]:
        if not PEER_PY.exists():
            print(f"peer {peer}: {PEER_PY} missing (make bench-peers)", flush=True)
            continue
        proc = subprocess.run([str(PEER_PY), str(HERE / "peer_atari_replay.py"), peer,
                               str(cap), str(reps), str(cache)],
                              capture_output=True, text=True, cwd=HERE)
        if proc.returncode != 0:
            print(f"peer {peer} failed: {proc.stderr[-800:]}", flush=True)
            continue
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"Atari replay, {cap:,} Pong transitions, sample(32) with stacks + IS weights")
    print(f"{'buffer':34s} {'B/transition':>12s} {'RSS B/tr':>9s} {'sample32 us':>12s}")
    for r in rows:
        print(f"{r['name']:34s} {r['bytes_per_transition']:12.0f} {r['rss_per_transition']:9.0f} "
              f"{r['sample32_us']:12.1f}")
    peers = rows[1:]
    if peers:
        small = min(peers, key=lambda r: r["bytes_per_transition"])
        prio = [r for r in peers if r.get("prioritized")]
        print(f"bytes ratio ours/smallest peer ({small['name']}): "
              f"{rows[0]['bytes_per_transition'] / small['bytes_per_transition']:.3f}")
        if prio:
            fast = min(prio, key=lambda r: r["sample32_us"])
            print(f"sample speed-up vs fastest prioritized peer ({fast['name']}): "
                  f"{fast['sample32_us'] / rows[0]['sample32_us']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
