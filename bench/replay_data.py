"""Transition layouts and random batches shared by the replay benchmark on both sides
(bench/replay_worker.py for pal_hpc, bench/peer_replay.py for cpprb in its own venv):
numpy only, so the peer venv can import it too."""

import numpy as np

SPECS = {
    "cartpole": {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32),
                 "next_obs": ((4,), np.float32), "done": ((), np.bool_)},
    "atari": {"obs": ((84, 84, 4), np.uint8), "action": ((), np.int64), "reward": ((), np.float32),
              "next_obs": ((84, 84, 4), np.uint8), "done": ((), np.bool_)},
}


def make_batch(spec, n, rng):
    """A batch of n random transitions laid out as `spec`."""
    out = {}
    for name, (shape, dtype) in spec.items():
        if dtype == np.bool_:
            out[name] = rng.random((n,) + shape) < 0.05
        elif np.issubdtype(dtype, np.integer):
            out[name] = rng.integers(0, 255, (n,) + shape).astype(dtype)
        else:
            out[name] = rng.random((n,) + shape).astype(dtype)
    return out
