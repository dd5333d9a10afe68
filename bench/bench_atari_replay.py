"""Atari replay memory and sampling: bytes per transition and the time of
sample(32) with stacks (4, 84, 84) + importance weights on a full buffer of Pong
frames, ours (FrameStackReplay: one frame per slot, K-ary PER) beside SB3's
ReplayBuffer(optimize_memory_usage=True) (uniform: the memory peer), cpprb's
PrioritizedReplayBuffer (next_of + stack_compress) and torchrl's
TensorDictPrioritizedReplayBuffer (whole stacks: torchrl has no frame dedup), each
run in .venv-peers by bench/peer_atari_replay.py on the same frames and fill
(bench/atari_frames.py).

    python bench/bench_atari_replay.py                      # 200k transitions
    python bench/bench_atari_replay.py --capacity 1000000   # the issue's 1M (~7 GB ours)
    python bench/bench_atari_replay.py --quick              # 10k, a check that it runs

Memory is the growth of each process's resident set over creating and filling the
buffer (the same way on every side; the table also shows the arrays' nbytes where
a library exposes them), per transition held.  A peer whose buffer at the capacity
would take more than --peer-mem-gb runs at the largest capacity that fits; each row
prints its capacity.  Sample time: median of --reps calls after 20 untimed ones, one
thread everywhere (OMP_NUM_THREADS=1, ours sample_threads=1 unless --sample-threads).
Ours stores n-step 3 rows (--n-step), the peers 1-step transitions: the same bytes
come out (two (32, 4, 84, 84) stacks), ours reads 7 distinct frames a sample, they 5.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from atari_frames import EPISODE, frames, row_stacks, rss_bytes
from to_target import PEER_PYTHON, ROOT, run_peer_script
from pal_hpc.replay import FrameStackReplay
from pal_hpc.runtime.nstep import transition_spec

HERE = Path(__file__).resolve().parent
CHUNK = 500


def ours(capacity, pong, reps, n_step=3, threads=1):
    """Fill our buffer with `capacity` rows of the protocol (one per observation,
    final observations included; k = min(n_step, steps left)) and time
    sample(32, beta=0.4)."""
    frame_buf = np.ones((CHUNK,) + pong.shape[1:], np.uint8)   # touched: not in the RSS growth
    small = {"action": np.zeros(CHUNK, np.int64), "reward": np.zeros(CHUNK, np.float32),
             "discount": np.ones(CHUNK, np.float32)}
    base = rss_bytes()
    rb = FrameStackReplay(transition_spec((4, 84, 84), np.uint8, frame_stack=True), capacity,
                          n_step=n_step, sample_threads=threads)
    t = 0
    while t < capacity:
        n = min(CHUNK, capacity - t)
        rows = t + np.arange(n)
        pos = rows % (EPISODE + 1)
        k = np.where(pos == EPISODE, 0, np.minimum(n_step, EPISODE - pos)).astype(np.int64)
        np.take(pong, rows % len(pong), axis=0, out=frame_buf[:n])
        rb.add(0, {"obs": frame_buf[:n], **{f: a[:n] for f, a in small.items()},
                   "nstep": k, "episode_start": pos == 0})
        t += n
    rss = rss_bytes() - base
    # Transitions held: every row but the final-observation rows.
    held = capacity - capacity // (EPISODE + 1)
    rng = np.random.default_rng(0)
    bad = 0
    for _ in range(20):
        s = rb.sample(32, beta=0.4, rng=rng)
        rows = s["indices"]
        k = np.minimum(n_step, EPISODE - rows % (EPISODE + 1))
        bad += int(np.sum(np.any((s["obs"] != row_stacks(pong, rows)).reshape(32, -1), 1)
                          | np.any((s["next_obs"] != row_stacks(pong, rows + k)).reshape(32, -1), 1)))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        rb.sample(32, beta=0.4, rng=rng)
        times.append(time.perf_counter() - t0)
    row = {"name": f"pal_hpc FrameStackReplay (PER, n-step {n_step})", "prioritized": True, "capacity": held,
           "bytes_per_transition": rb.nbytes / held, "rss_per_transition": rss / held,
           "sample32_us": 1e6 * float(np.median(times)), "threads": rb.sample_threads,
           "checked": 20 * 32, "mismatched": bad, "mismatched_at_done": 0}
    rb.close()
    return row


def peer_rows(names, cap, reps, cache, mem_gb):
    """One row per peer that ran (in .venv-peers); a peer that fails is reported."""
    rows = []
    if names and not PEER_PYTHON.exists():
        print(f"peers: none -- {PEER_PYTHON.relative_to(ROOT)} is missing; install it with "
              f"`make bench-peers`", flush=True)
        return rows
    for peer in names:
        try:
            rows.append(run_peer_script("peer_atari_replay.py",
                                        [peer, "--capacity", str(cap), "--reps", str(reps),
                                         "--frames", str(cache), "--mem-gb", str(mem_gb)],
                                        timeout=3600, python=PEER_PYTHON))
        except Exception as exc:  # noqa: BLE001 - a failed peer is reported, the rest run
            print(f"peer {peer} failed: {exc}", flush=True)
    return rows


def fmt_b(v):
    return "-" if v is None else f"{v:,.0f}"


def report(cap, rows):
    """The table, the peer/ours ratios and the issue's two targets."""
    me, peers = rows[0], rows[1:]
    print(f"Atari replay: Pong frames, {cap:,} slots requested, sample(32) with stacks "
          f"(4, 84, 84) + importance weights (beta 0.4); memory = resident-set growth")
    print(f"{'buffer':46s} {'capacity':>9s} {'RSS B/tr':>9s} {'nbytes B/tr':>11s} "
          f"{'sample32 us':>11s} {'stacks checked':>15s}")
    for r in rows:
        chk = f"{r['mismatched']}/{r['checked']} wrong"
        print(f"{r['name']:46s} {r['capacity']:9,d} {fmt_b(r['rss_per_transition']):>9s} "
              f"{fmt_b(r['bytes_per_transition']):>11s} {r['sample32_us']:11.1f} {chk:>15s}")
    if not peers:
        return
    print("peer vs ours (ratio = peer / ours: memory x larger, sample x slower):")
    for r in peers:
        print(f"  {r['name']:44s} RSS B/tr {r['rss_per_transition']:8,.0f} / "
              f"{me['rss_per_transition']:,.0f} = {r['rss_per_transition'] / me['rss_per_transition']:5.2f}x"
              f"   sample32 {r['sample32_us']:8.1f} / {me['sample32_us']:.1f} us = "
              f"{r['sample32_us'] / me['sample32_us']:5.2f}x")
    small = min(peers, key=lambda r: r["rss_per_transition"])
    ratio = me["rss_per_transition"] / small["rss_per_transition"]
    print(f"target memory: ours / smallest peer ({small['name']}) = {ratio:.3f} "
          f"(target <= 1.05: {'met' if ratio <= 1.05 else 'MISSED'})")
    prio = [r for r in peers if r.get("prioritized")]
    if prio:
        fast = min(prio, key=lambda r: r["sample32_us"])
        speed = fast["sample32_us"] / me["sample32_us"]
        print(f"target sample: fastest prioritized peer ({fast['name']}) / ours = {speed:.2f}x "
              f"(target >= 2: {'met' if speed >= 2 else 'MISSED'})")
    for r in rows:
        if r.get("mismatched"):
            print(f"note: {r['name']} returned {r['mismatched']} of {r['checked']} checked "
                  f"transitions with a stack unlike the env's ({r['mismatched_at_done']} of "
                  f"them at an episode's last step)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", type=int, default=200_000,
                    help="transitions (slots) per buffer; default 200k fits a shared 24 GB "
                         "machine, the issue's 1M needs ~7 GB for ours (default 200000)")
    ap.add_argument("--quick", action="store_true", help="10k transitions, 100 sample calls")
    ap.add_argument("--reps", type=int, default=500, help="timed sample(32) calls (default 500)")
    ap.add_argument("--peers", default="sb3,cpprb,torchrl",
                    help="comma-separated peers, empty for none (default sb3,cpprb,torchrl)")
    ap.add_argument("--peer-mem-gb", type=float, default=6.0,
                    help="most memory one peer's buffer may take; a peer that would need "
                         "more runs at a smaller capacity, printed (default 6)")
    ap.add_argument("--n-step", type=int, default=3,
                    help="our n-step (default 3, DQN's Atari default: a sample reads the "
                         "window t-3..t+3, 7 frames; the peers store 1-step transitions, 5)")
    ap.add_argument("--sample-threads", type=int, default=1,
                    help="our OpenMP threads for the copy-out (default 1, as the runtime; "
                         "the peers have no parallel sample)")
    args = ap.parse_args()
    if args.n_step < 1 or args.sample_threads < 1:
        ap.error("--n-step and --sample-threads must be >= 1")
    if args.capacity < 1000:
        ap.error(f"--capacity must be at least 1000, got {args.capacity}")
    cap = 10_000 if args.quick else args.capacity
    reps = 100 if args.quick else args.reps
    cache = HERE / ".pong_frames.npy"
    pong = frames(cache)
    rows = [ours(cap, pong, reps, args.n_step, args.sample_threads)]
    rows += peer_rows([p for p in args.peers.split(",") if p], cap, reps, cache, args.peer_mem_gb)
    report(cap, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
