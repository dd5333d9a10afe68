"""Run under mpiexec: writers and samplers hammer one FrameStackReplay in a node window.

Ranks 0..W-1 write (rank r into region r, `--envs` streams each, episodes of random
length ending in a final-observation row, batches of random size); the other
ranks sample batches of 32 and update priorities with their tickets.  Every frame
carries its stamp (writer, env, episode, t) in its first bytes and a pattern
derived from it in all the others, so a sampled stack is checked on its own: all
frames whole (not torn) and of one episode of one env, obs = frames
max(0, t-3..t), next_obs = frames max(0, t+k-3..t+k) with k = the row's n-step
(written into its reward), never beyond the episode's final observation.  After
the writers stop: the live set is exactly the rows whose window and successor are
stored, total() is the sum of the leaves, and stale tickets are dropped.  With
one rank, that rank alternates writing and sampling.

    mpiexec -n 4 python -m mpi4py tests/mpi/frame_replay_stress.py --writers 2 --seconds 3
"""

import argparse
import sys
import time

import numpy as np
from mpi4py import MPI

from pal_hpc.cluster import node_comm
from pal_hpc.replay import FrameStack, FrameStackReplay

STACK, N_STEP, H = 4, 3, 16
SPEC = {"obs": FrameStack((H, H), np.uint8, STACK), "action": ((), np.int64),
        "reward": ((), np.float32), "discount": ((), np.float32)}


def encode(stamps: np.ndarray) -> np.ndarray:
    """Frames (n, H, H) for stamps (n, 4) int32."""
    n = stamps.shape[0]
    out = np.empty((n, H * H), np.uint8)
    out[:, :16] = stamps.astype("<i4").view(np.uint8).reshape(n, 16)
    seed = (stamps.astype(np.int64) * np.array([7919, 104729, 1299709, 15485863])).sum(1)
    out[:, 16:] = ((np.arange(H * H - 16)[None, :] * (seed[:, None] % 251 + 1)
                    + seed[:, None]) % 256).astype(np.uint8)
    return out.reshape(n, H, H)


def decode(frames: np.ndarray) -> np.ndarray:
    """Stamps (..., 4) of frames (..., H, H)."""
    flat = np.ascontiguousarray(frames.reshape(-1, H * H)[:, :16])
    return flat.view("<i4").reshape(frames.shape[:-2] + (4,))


class Writer:
    """Episodes for `envs` streams of one region."""

    def __init__(self, rb, region, envs, rng):
        self.rb, self.region, self.rng = rb, region, rng
        self.state = [[0, 0, int(rng.integers(1, 30))] for _ in range(envs)]  # ep, t, length

    def write_some(self):
        e = int(self.rng.integers(len(self.state)))
        ep, t, length = self.state[e]
        rows = []
        for _ in range(int(self.rng.integers(1, 16))):
            k = min(N_STEP, length - t)            # 0 at the final observation
            rows.append(((self.region, e, ep, t), k, t == 0))
            if k == 0:
                ep, t, length = ep + 1, 0, int(self.rng.integers(1, 30))
            else:
                t += 1
        self.state[e] = [ep, t, length]
        stamps = np.array([r[0] for r in rows], np.int32)
        k = np.array([r[1] for r in rows], np.int64)
        self.rb.add(self.region, {"obs": encode(stamps), "action": stamps[:, 3].astype(np.int64),
                                  "reward": k.astype(np.float32),
                                  "discount": np.ones(len(rows), np.float32),
                                  "nstep": k, "episode_start": np.array([r[2] for r in rows])},
                    stream=e)
        return len(rows)


def check_sample(s) -> list[str]:
    bad = []
    for name in ("obs", "next_obs"):
        frames = s[name]
        st = decode(frames)
        if not np.array_equal(encode(st.reshape(-1, 4)).reshape(frames.shape), frames):
            bad.append(f"{name}: a torn or foreign frame")
    o, nx = decode(s["obs"]), decode(s["next_obs"])
    t, k = s["action"], s["reward"].astype(np.int64)
    want = np.maximum(0, t[:, None] - STACK + 1 + np.arange(STACK))
    want_next = np.maximum(0, (t + k)[:, None] - STACK + 1 + np.arange(STACK))
    same = (o[:, :, :3] == o[:, -1:, :3]).all(axis=(1, 2)) & \
        (nx[:, :, :3] == o[:, -1:, :3]).all(axis=(1, 2))
    if not same.all():
        bad.append("frames from another env or episode")
    if not (np.array_equal(o[:, :, 3], want) and np.array_equal(nx[:, :, 3], want_next)):
        bad.append("wrong frames in a stack")
    if not ((k >= 1) & (k <= N_STEP)).all():
        bad.append("a sampled row is not a transition")
    return bad


def expected_live(rb) -> set:
    cols, live = rb._columns, set()
    for q in range(rb.regions * rb.streams):
        w, base = rb._ring_writes(rb._control)[q], q * rb.stream_len
        for u in range(max(0, w - rb.stream_len), w):
            slot = base + u % rb.stream_len
            k, first = int(cols["_k"][slot]), int(cols["_first"][slot])
            if k > 0 and u + k < w and max(first, u - STACK + 1) >= w - rb.stream_len:
                live.add(slot)
    return live


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--writers", type=int, default=1)
    ap.add_argument("--envs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--capacity", type=int, default=3000)
    ap.add_argument("--self-test-tear", action="store_true",
                    help="corrupt one byte of one sampled frame: the check must fail")
    args = ap.parse_args()
    world = MPI.COMM_WORLD
    node = node_comm(world)
    rank, size = world.Get_rank(), world.Get_size()
    writers = min(args.writers, size)
    failures = []
    rng = np.random.default_rng(rank)
    with FrameStackReplay(SPEC, args.capacity, comm=node, regions=writers, streams=args.envs,
                          n_step=N_STEP, sample_threads=1) as rb:
        writer = Writer(rb, rank, args.envs, rng) if rank < writers else None
        sampler = rank >= writers or size == 1
        wrote = sampled = updates = 0
        t_end = time.monotonic() + args.seconds
        while time.monotonic() < t_end:
            if writer is not None:
                wrote += writer.write_some()
            if sampler:
                try:
                    s = rb.sample(32, rng=rng)
                except ValueError:           # nothing complete yet
                    time.sleep(0.001)
                    continue
                if args.self_test_tear and sampled == 0:
                    s["next_obs"][0, 1, H - 1, H - 1] ^= 1
                failures += check_sample(s)
                sampled += 32
                updates += rb.update_priorities(s["indices"], rng.random(32) * 3, s["tickets"])
        req = world.Ibarrier()
        while not req.Test():
            time.sleep(0.001)
        if rank == 0:
            live = set(np.flatnonzero(rb.priorities(np.arange(rb.capacity)) > 0).tolist())
            if live != expected_live(rb):
                failures.append(f"live set differs from the complete windows "
                                f"({len(live ^ expected_live(rb))} slots)")
            leaves = rb.priorities(np.arange(rb.capacity)).astype(np.float64).sum()
            if abs(rb.total() - leaves) > 1e-5 * max(1.0, leaves):
                failures.append(f"total {rb.total()} != sum of leaves {leaves}")
            s = rb.sample(256, rng=rng)
            failures += check_sample(s)
            steps = rb._columns["_step"][s["indices"]].copy()
            for _ in range(40):
                writer.write_some()
            live = set(np.flatnonzero(rb.priorities(np.arange(rb.capacity)) > 0).tolist())
            current = sum(i in live and rb._columns["_step"][i] == u
                          for i, u in zip(s["indices"].tolist(), steps.tolist()))
            applied = rb.update_priorities(s["indices"], np.ones(256), s["tickets"])
            if applied != current:
                failures.append(f"{applied} updates applied, {current} rows still current")
        print(f"rank {rank}: wrote {wrote} sampled {sampled} updates {updates} "
              f"failures {failures[:3]}", flush=True)
    ok = world.allreduce(not failures, op=MPI.LAND)
    if rank == 0:
        print(f"ranks={size} writers={writers} ok={ok}", flush=True)
    node.Free()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
