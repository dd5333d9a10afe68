"""Peer side of bench/bench_atari_replay.py (run with .venv-peers/bin/python): one
peer's Atari replay on the same Pong frames and the same fill as ours.

    .venv-peers/bin/python bench/peer_atari_replay.py PEER --capacity N --reps R \
        --frames bench/.pong_frames.npy [--mem-gb G]

PEER is one of
  sb3      Stable-Baselines3 ReplayBuffer(optimize_memory_usage=True): obs stacks
           stored once (next_obs is the next slot), uniform (SB3 has no PER), so it
           is the memory peer; its sample(32) time is reported too.
  cpprb    cpprb PrioritizedReplayBuffer, next_of=("obs",), stack_compress="obs"
           (obs (84, 84, 4): cpprb wants the stack on the last axis), on_episode_end()
           after each episode; sample(32, beta=0.4) with weights.
  torchrl  torchrl TensorDictPrioritizedReplayBuffer over LazyTensorStorage, the
           layout torchrl's DQN stores: "observation" and ("next", "observation")
           as whole stacks (torchrl has no frame dedup); sample() of 32 with
           importance weights ("priority_weight"; "_weight" in older torchrl).

Each fills exactly its capacity with transitions 0..capacity-1 of the protocol in
bench/atari_frames.py (untimed), so slot i holds transition i; then R timed
sample(32) calls after 20 untimed ones.  Memory is measured as the growth of the
process's resident set over creating + filling the buffer (the same way for every
peer and for ours), and also as the nbytes of the arrays where the library exposes
them.  A peer whose stacks at its capacity would exceed --mem-gb (or 80% of the
machine's available memory) runs at the largest capacity that fits; the JSON
names the capacity used.  Samples are checked against the protocol's stacks and
the mismatches counted.  Prints one JSON line on stdout.
"""

import argparse
import importlib
import json
import os
import sys
import time

import numpy as np

from atari_frames import STACK, chunks, rss_bytes, stacks

WARMUP = 20
BATCH = 32
BETA = 0.4
ALPHA = 0.6


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def mem_available() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


# -- the peers: make(capacity, frame) -> (name, prioritized, add(obs, next_obs, done),
#    end_episode(), sample() (the library's own call: timed), checked_sample() -> (slots,
#    obs, next_obs, weights or None) with obs as (B, STACK, H, W), nbytes() or None) -----

def sb3(capacity, frame):
    import gymnasium as gym
    import stable_baselines3
    from stable_baselines3.common.buffers import ReplayBuffer

    obs_space = gym.spaces.Box(0, 255, (STACK, *frame), np.uint8)
    # handle_timeout_termination=False: SB3 refuses it with optimize_memory_usage.
    rb = ReplayBuffer(capacity, obs_space, gym.spaces.Discrete(6), device="cpu",
                      optimize_memory_usage=True, handle_timeout_termination=False)
    act = np.zeros((1, 1), np.int64)
    rew = np.zeros(1, np.float32)
    infos = [{}]

    def add(obs, nxt, done):
        for i in range(len(obs)):
            rb.add(obs[i:i + 1], nxt[i:i + 1], act, rew, done[i:i + 1], infos)

    def nbytes():
        return sum(a.nbytes for a in (rb.observations, rb.actions, rb.rewards, rb.dones,
                                      rb.timeouts))

    def indexed_sample():
        # SB3's sample() does not return indices: draw them as it does (uniform over
        # the slots whose next observation is intact) and read them through its own
        # _get_samples, so the check covers what sample() returns.
        inds = (np.random.randint(1, rb.buffer_size, size=BATCH) + rb.pos) % rb.buffer_size
        s = rb._get_samples(inds)
        return inds, s.observations.numpy(), s.next_observations.numpy(), None

    return (f"SB3 {stable_baselines3.__version__} ReplayBuffer(omu) [uniform]", False,
            add, lambda: None, lambda: rb.sample(BATCH), indexed_sample, nbytes)


def cpprb(capacity, frame):
    import importlib.metadata as md

    from cpprb import PrioritizedReplayBuffer

    rb = PrioritizedReplayBuffer(
        capacity, {"obs": {"shape": (*frame, STACK), "dtype": np.uint8},
                   "act": {"dtype": np.int64}, "rew": {"dtype": np.float32},
                   "done": {"dtype": np.float32}},
        alpha=ALPHA, next_of=("obs",), stack_compress="obs")
    act = np.zeros(500, np.int64)
    rew = np.zeros(500, np.float32)

    def add(obs, nxt, done):
        n = len(obs)
        # cpprb's stack axis is the last one: (n, H, W, STACK).
        rb.add(obs=np.moveaxis(obs, 1, -1), next_obs=np.moveaxis(nxt, 1, -1),
               act=act[:n], rew=rew[:n], done=done.astype(np.float32))

    def sample():
        s = rb.sample(BATCH, beta=BETA)
        return (s["indexes"], np.moveaxis(s["obs"], -1, 1), np.moveaxis(s["next_obs"], -1, 1),
                s["weights"])

    return (f"cpprb {md.version('cpprb')} PER next_of+stack_compress", True,
            add, rb.on_episode_end, lambda: rb.sample(BATCH, beta=BETA), sample, lambda: None)


def torchrl(capacity, frame):
    import torch
    import torchrl as trl
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer

    torch.set_num_threads(1)     # ours samples on one thread (sample_threads=1)
    rb = TensorDictPrioritizedReplayBuffer(alpha=ALPHA, beta=BETA,
                                           storage=LazyTensorStorage(capacity),
                                           batch_size=BATCH)

    def add(obs, nxt, done):
        n = len(obs)
        td = TensorDict({"observation": torch.from_numpy(obs),
                         "action": torch.zeros(n, dtype=torch.int64),
                         "next": {"observation": torch.from_numpy(nxt),
                                  "reward": torch.zeros(n, 1),
                                  "done": torch.from_numpy(done).unsqueeze(-1),
                                  "terminated": torch.from_numpy(done).unsqueeze(-1)}},
                        batch_size=[n])
        rb.extend(td)

    def sample():
        s = rb.sample()
        return (s["index"].numpy(), s["observation"].numpy(),
                s["next", "observation"].numpy(), s[weight_key(s)].numpy())

    def weight_key(s):
        # "priority_weight" in torchrl 0.14, "_weight" before.
        return "priority_weight" if "priority_weight" in s.keys() else "_weight"

    def nbytes():
        return int(rb.storage._storage.bytes())

    return (f"torchrl {trl.__version__} TensorDictPrioritizedRB", True,
            add, lambda: None, rb.sample, sample, nbytes)


PEERS = {"sb3": sb3, "cpprb": cpprb, "torchrl": torchrl}
# Imported before the memory baseline, so that the RSS growth is the buffer's.
MODULES = {"sb3": ("gymnasium", "stable_baselines3.common.buffers"), "cpprb": ("cpprb",),
           "torchrl": ("torch", "tensordict", "torchrl.data")}
# Bytes per transition of each peer's stacks, to size a capacity that fits.
STACKS_PER_TRANSITION = {"sb3": STACK, "cpprb": 1, "torchrl": 2 * STACK}


def fitted_capacity(peer, capacity, frame_bytes, mem_gb):
    est = STACKS_PER_TRANSITION[peer] * frame_bytes + 64
    budget = min(mem_gb * 2**30, 0.8 * mem_available())
    return max(1000, min(capacity, int(budget // est)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("peer", choices=sorted(PEERS))
    ap.add_argument("--capacity", type=int, required=True)
    ap.add_argument("--reps", type=int, default=500)
    ap.add_argument("--frames", required=True, help="the .npy of Pong frames")
    ap.add_argument("--mem-gb", type=float, default=6.0,
                    help="most memory this peer's buffer may take (default 6)")
    args = ap.parse_args()
    pong = np.load(args.frames, allow_pickle=False)
    frame = pong.shape[1:]
    cap = fitted_capacity(args.peer, args.capacity, int(np.prod(frame)), args.mem_gb)
    if cap < args.capacity:
        log(f"{args.peer}: capacity {args.capacity:,} does not fit in {args.mem_gb} GB "
            f"(or 80% of available memory); measuring at {cap:,}")
    chunk = 500
    # Touched now, so that the fill's own buffers are not part of the RSS growth.
    bufs = (np.ones((chunk, STACK, *frame), np.uint8), np.ones((chunk, STACK, *frame), np.uint8))
    for mod in MODULES[args.peer]:
        importlib.import_module(mod)

    base = rss_bytes()        # before the buffer is made: some allocate (and touch) it eagerly
    name, prioritized, add, end_episode, sample, indexed_sample, nbytes = \
        PEERS[args.peer](cap, frame)
    t0 = time.perf_counter()
    for start, stop in chunks(cap, chunk):
        obs, nxt, done = stacks(pong, np.arange(start, stop), out=bufs)
        add(obs, nxt, done)
        if done[-1]:
            end_episode()
    fill_s = time.perf_counter() - t0
    rss = rss_bytes() - base
    log(f"{args.peer}: filled {cap:,} in {fill_s:.1f} s")

    bad = bad_done = checked = 0
    for _ in range(WARMUP):
        t, obs, nxt, w = indexed_sample()
        want_obs, want_nxt, done = stacks(pong, np.asarray(t, np.int64))
        wrong = (np.any(obs.reshape(BATCH, -1) != want_obs.reshape(BATCH, -1), 1)
                 | np.any(nxt.reshape(BATCH, -1) != want_nxt.reshape(BATCH, -1), 1))
        bad += int(wrong.sum())
        bad_done += int((wrong & done).sum())
        checked += BATCH
        if prioritized and (w is None or w.shape[0] != BATCH):
            raise SystemExit(f"{args.peer}: sample returned no importance weights")
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        sample()
        times.append(time.perf_counter() - t0)
    nb = nbytes()
    print(json.dumps({"name": name, "peer": args.peer, "prioritized": prioritized,
                      "capacity": cap, "rss_per_transition": rss / cap,
                      "bytes_per_transition": None if nb is None else nb / cap,
                      "sample32_us": 1e6 * float(np.median(times)),
                      "checked": checked, "mismatched": bad, "mismatched_at_done": bad_done, "fill_s": fill_s,
                      "omp_threads": os.environ.get("OMP_NUM_THREADS")}), flush=True)


if __name__ == "__main__":
    main()
