"""cpprb counterpart of bench/replay_worker.py (run with .venv-peers/bin/python).

W writer processes add pre-generated batches of 64 transitions to one cpprb
MPPrioritizedReplayBuffer (shared memory); the main process is the learner and
samples 256 + updates their priorities.  Same protocol as replay_worker.py:
fill `--prefill` of the capacity (all of it by default), then everyone runs for
`--seconds`; rates are
count / own elapsed time, writers summed.  Prints one JSON line on stdout.
"""

import argparse
import json
import multiprocessing as mp
import sys
import time

import numpy as np
from cpprb import MPPrioritizedReplayBuffer
from replay_data import SPECS, make_batch

ADD_BATCH = 64
SAMPLE_BATCH = 256
CTX = mp.get_context("fork")  # cpprb's default "sharedctypes" backend is inherited over fork


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def env_dict(spec):
    # cpprb wants {"name": {"shape": ..., "dtype": ...}}; scalars are shape 1.
    return {name: {"shape": shape if shape else 1, "dtype": dtype}
            for name, (shape, dtype) in spec.items()}


def writer(rank, rb, kind, seconds, barrier, stop, results):
    count, elapsed = 0, 0.0
    try:
        batch = make_batch(SPECS[kind], ADD_BATCH, np.random.default_rng(rank))
        barrier.wait(timeout=60)
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while time.perf_counter() < deadline and not stop.is_set():
            rb.add(**batch)
            count += ADD_BATCH
        elapsed = time.perf_counter() - t0
    finally:
        results.put((rank, count, elapsed))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--writers", type=int, required=True)
    ap.add_argument("--capacity", type=int, default=1 << 20)
    ap.add_argument("--kind", choices=sorted(SPECS), default="cartpole")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--prefill", type=float, default=1.0)
    args = ap.parse_args()

    spec = SPECS[args.kind]
    W = args.writers
    rb = MPPrioritizedReplayBuffer(args.capacity, env_dict(spec), ctx=CTX)
    rng = np.random.default_rng(W)  # learner "rank" = W, as in replay_worker.py

    # Prefill (untimed) in large chunks: cpprb's per-call cost would make a full
    # 2^20 buffer take half a minute in batches of 64.
    row_bytes = sum(int(np.prod(shape)) * np.dtype(dt).itemsize for shape, dt in spec.values())
    chunk = max(ADD_BATCH, min(8192, (64 << 20) // row_bytes))
    pre = make_batch(spec, chunk, np.random.default_rng(0))
    todo = max(ADD_BATCH, int(args.capacity * args.prefill))
    while todo > 0:
        n = min(chunk, todo)
        rb.add(**{k: v[:n] for k, v in pre.items()})
        todo -= n
    log(f"prefilled {rb.get_stored_size()} transitions")

    barrier = CTX.Barrier(W + 1)
    stop = CTX.Event()
    results = CTX.Queue()
    procs = [CTX.Process(target=writer, args=(r, rb, args.kind, args.seconds, barrier, stop, results),
                         daemon=True) for r in range(W)]
    for p in procs:
        p.start()

    cycles, l_elapsed, got = 0, 0.0, []
    try:
        barrier.wait(timeout=60)
        t0 = time.perf_counter()
        deadline = t0 + args.seconds
        while time.perf_counter() < deadline:
            s = rb.sample(SAMPLE_BATCH, beta=0.4)
            rb.update_priorities(s["indexes"], rng.random(SAMPLE_BATCH))
            cycles += 1
        l_elapsed = time.perf_counter() - t0
    finally:
        stop.set()
        end = time.monotonic() + args.seconds + 30
        while len(got) < W and time.monotonic() < end:
            try:
                got.append(results.get(timeout=1.0))
            except Exception:  # queue.Empty
                if not any(p.is_alive() for p in procs) and results.empty():
                    break
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                log(f"writer pid {p.pid} did not exit; terminating")
                p.terminate()
                p.join(timeout=5)
    if len(got) != W:
        raise SystemExit(f"only {len(got)} of {W} writers reported")

    inserts = sum(c / e for _, c, e in got if e > 0) if W else 0.0
    learner = cycles / l_elapsed if l_elapsed > 0 else 0.0
    log("per-writer inserts/s:", [round(c / e) for _, c, e in sorted(got) if e > 0])
    print(json.dumps({"kind": args.kind, "writers": W, "capacity": args.capacity,
                      "inserts_per_s": inserts, "learner_cycles_per_s": learner}), flush=True)


if __name__ == "__main__":
    main()
