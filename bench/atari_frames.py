"""Pong frames for the Atari replay benchmark (shared by ours and the peers' side):
a short real rollout of ALE/Pong-v5 through make_env's preprocessing, saved once as
.npy (uint8 (n, 84, 84), no pickle), and the fill protocol both sides follow."""

import numpy as np

EPISODE = 1000       # steps per synthetic episode when filling (a final row ends each)
N_FRAMES = 512


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
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096
