"""FrameStackReplay on real Atari trajectories (make_env's preprocessing: gymnasium's
AtariPreprocessing + FrameStackObservation): every transition the buffer can return
rebuilds obs and next_obs bit-identical to the stacks the env emitted (the
non-deduplicated reference), across resets, terminations (Breakout with
--atari-terminal-on-life-loss loses lives fast under random play), time-limit
truncations (a small max_episode_steps) and ring overwrites, for n-step 1 and 3 and
one or several envs per actor."""

import gymnasium as gym
import numpy as np
import pytest

from frame_streams import Streams, check_sample
from pal_hpc.envs import make_env
from pal_hpc.replay import FrameStackReplay
from pal_hpc.runtime.nstep import transition_spec

SPEC = transition_spec((4, 84, 84), np.uint8, frame_stack=True)


def atari(env_id, seed, life_loss, max_steps):
    env = make_env(env_id, seed, terminal_on_life_loss=life_loss)
    return gym.wrappers.TimeLimit(env, max_episode_steps=max_steps)


@pytest.mark.parametrize("env_id,life_loss,n_step,n_envs,max_steps", [
    ("ALE/Pong-v5", False, 1, 1, 40),
    ("ALE/Pong-v5", True, 3, 2, 25),
    ("ALE/Breakout-v5", True, 3, 3, 60),
    ("ALE/Breakout-v5", False, 1, 2, 30),
])
def test_every_stack_is_what_the_env_emitted(env_id, life_loss, n_step, n_envs, max_steps):
    # Streams of 90 slots: a few hundred steps overwrite each ring more than twice.
    rb = FrameStackReplay(SPEC, 90 * n_envs, streams=n_envs, n_step=n_step)
    envs = [atari(env_id, 10 + i, life_loss, max_steps) for i in range(n_envs)]
    st = Streams(rb, 0, envs, n_step, gamma=0.99, seed=10)
    checked = 0
    for t in range(240):
        st.step()
        if t % 8 == 7:
            st.flush()
            live = np.flatnonzero(rb.priorities(np.arange(rb.capacity)) > 0)
            out = rb._outputs(live.size)
            tk, pr, ok = (np.zeros(live.size, d) for d in (np.uint64, np.float32, np.uint8))
            assert rb._copy_out(live.astype(np.int64), out, tk, pr, ok) == live.size
            assert check_sample({**out, "indices": live}, st.by_slot) == []
            checked += live.size
    # The trajectories had what the test is about.
    assert checked > 1000
    assert st.ends["truncated"] > 0, st.ends
    if life_loss and env_id == "ALE/Breakout-v5":
        assert st.ends["terminated"] > 0, st.ends
    for env in envs:
        env.close()
