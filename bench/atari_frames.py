"""Pong frames for the Atari replay benchmark (shared by ours and the peers' side):
a short real rollout of ALE/Pong-v5 through make_env's preprocessing, saved once as
.npy (uint8 (n, 84, 84), no pickle), and the fill protocol both sides follow.

Fill protocol: synthetic episodes of EPISODE transitions, i.e. EPISODE + 1
observations each (the last one the episode's final observation).  Observation
p of episode e is "row" r = e * (EPISODE + 1) + p and its newest frame is
frames[r % len(frames)]; its stack is the frames of rows r-3..r, never reaching
below the episode's first row (repeated there, as FrameStackObservation pads).
Ours stores one row per observation; a peer stores transition t (episode
t // EPISODE, step t % EPISODE) as the stacks of rows r and r + 1."""

import ctypes

import numpy as np

EPISODE = 1000       # steps per synthetic episode when filling (a final row ends each)
N_FRAMES = 512
STACK = 4


def frames(path):
    """The newest frames of N_FRAMES real Pong observations (cached in `path`)."""
    try:
        return np.load(path, allow_pickle=False)
    except OSError:
        from pal_hpc.envs import make_env
        env = make_env("ALE/Pong-v5", 0)
        obs, _ = env.reset(seed=0)
        out = [obs[-1]]
        rng = np.random.default_rng(0)
        while len(out) < N_FRAMES:
            obs, _, term, trunc, _ = env.step(int(rng.integers(env.action_space.n)))
            out.append(obs[-1])
            if term or trunc:
                obs, _ = env.reset()
        env.close()
        arr = np.stack(out)
        np.save(path, arr, allow_pickle=False)
        return arr


def rss_bytes() -> int:
    """This process's resident set, after handing glibc's free heap pages back to the
    system (a fill's freed temporaries would otherwise count as the buffer's)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096


def transition_rows(t):
    """Rows (see the module docstring) of the observations of transitions `t`."""
    t = np.asarray(t, np.int64)
    return (t // EPISODE) * (EPISODE + 1) + t % EPISODE, t % EPISODE


def row_stacks(pong, rows, out=None):
    """The (n, STACK, H, W) stacks of observation rows `rows` (oldest frame first,
    padded with the episode's first frame); `out`: an array to fill instead."""
    rows = np.asarray(rows, np.int64)
    pos = rows % (EPISODE + 1)
    back = np.arange(STACK - 1, -1, -1)                       # 3, 2, 1, 0
    src = rows[:, None] - np.minimum(back[None, :], pos[:, None])
    if out is None:
        out = np.empty((rows.size, STACK) + pong.shape[1:], pong.dtype)
    return np.take(pong, src % len(pong), axis=0, out=out[:rows.size])


def stacks(pong, t, out=None):
    """(obs, next_obs, done) of transitions `t`: two (n, STACK, H, W) uint8 stacks and
    done = the transition ends its episode.  `out`: an (obs, next_obs) pair of
    arrays to fill instead of allocating."""
    rows, pos = transition_rows(t)
    out = out or (None, None)
    return (row_stacks(pong, rows, out[0]), row_stacks(pong, rows + 1, out[1]),
            pos == EPISODE - 1)


def chunks(capacity, size=500):
    """(start, stop) transition ranges that fill `capacity` transitions in order,
    none longer than `size` and none crossing an episode's end (peers that must
    be told of an episode's end are told after the chunk that ends it)."""
    t = 0
    while t < capacity:
        stop = min(t + size, capacity, (t // EPISODE + 1) * EPISODE)
        yield t, stop
        t = stop
