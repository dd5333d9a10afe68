"""LockstepVectorEnv's gymnasium API beyond step: autoreset modes, reset_async, call,
get_attr/set_attr, render, np_random_seed, gymnasium's error types and messages, timeouts,
mismatched sub-env spaces, worker exceptions raised as their own type, and no hang at
interpreter exit."""

import multiprocessing as mp
import re
import subprocess
import sys
import time
import warnings
from contextlib import closing

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode

from conftest import ROOT
from pal_hpc.envs.lockstep import LockstepError, LockstepVectorEnv
from test_lockstep import _alive


def _short(i=0, **kw):
    def fn():
        return gym.make("CartPole-v1", max_episode_steps=8, **kw)
    return fn


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.DISABLED,
                                  AutoresetMode.NEXT_STEP])
def test_autoreset_modes_match_sync(mode):
    fns = [_short()] * 3
    with LockstepVectorEnv(fns, 2, autoreset_mode=mode) as ours, \
            closing(gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)) as ref:
        assert ours.metadata["autoreset_mode"] == mode
        assert data_equivalence(ours.reset(seed=1), ref.reset(seed=1))
        ends = 0
        for t in range(30):
            a = np.array([t % 2, 1, 0])
            r1, r2 = ours.step(a), ref.step(a)
            assert data_equivalence(r1, r2), t
            ends += int(r1[2].sum() + r1[3].sum())
            if mode == AutoresetMode.DISABLED and (r1[2] | r1[3]).any():
                mask = r1[2] | r1[3]          # the caller resets what ended
                assert data_equivalence(ours.reset(seed=t, options={"reset_mask": mask}),
                                        ref.reset(seed=t, options={"reset_mask": mask.copy()}))
        assert ends >= 3
        if mode == AutoresetMode.SAME_STEP:
            assert "final_obs" in r1[4] or ends


def test_reset_async_and_out_of_order_calls():
    with LockstepVectorEnv([_short()] * 2, 2) as env:
        with pytest.raises(NoAsyncCallError, match=re.escape("`reset_wait` without any prior")):
            env.reset_wait()
        env.reset_async(seed=0)
        with pytest.raises(AlreadyPendingCallError, match="pending call to `reset`"):
            env.step_async(np.zeros(2, np.int64))
        obs, _ = env.reset_wait()
        assert obs.shape == (2, 4)
        env.step_async(np.zeros(2, np.int64))
        with pytest.raises(AlreadyPendingCallError, match="pending call to `step`"):
            env.call_async("gravity")
        env.step_wait()
        with pytest.raises(NoAsyncCallError, match="`step_wait` without any prior"):
            env.step_wait()
        env.reset_async()
        with pytest.warns(UserWarning, match="Calling `close` while waiting for a pending call"):
            env.close()
    with pytest.raises(ClosedEnvironmentError, match="after a call to `close"):
        env.reset()


def test_call_get_attr_set_attr_render_and_seeds():
    fns = [_short(render_mode="rgb_array")] * 3
    with LockstepVectorEnv(fns, 2) as env:
        env.reset(seed=40)
        assert env.np_random_seed == (40, 41, 42)
        assert env.get_attr("gravity") == (9.8,) * 3
        env.set_attr("gravity", [1.0, 2.0, 3.0])
        assert env.call("gravity") == (1.0, 2.0, 3.0)
        env.set_attr("gravity", 5.0)
        assert env.get_attr("gravity") == (5.0,) * 3
        with pytest.raises(ValueError, match="Got `2` values for 3 environments"):
            env.set_attr("gravity", [1.0, 2.0])
        frames = env.render()             # 400x600x3 each: larger than the message area
        assert isinstance(frames, tuple) and [f.shape for f in frames] == [(400, 600, 3)] * 3
        rngs = env.np_random
        with closing(gym.vector.SyncVectorEnv(fns)) as ref:
            ref.reset(seed=40)
            assert [r.random() for r in rngs] == [r.random() for r in ref.np_random]
        with pytest.raises(ValueError, match="use `step` directly"):
            env.call("step", 0)
        with pytest.raises(AttributeError, match="no_such_thing"):
            env.get_attr("no_such_thing")
        assert env.closed                 # a worker's error ends the env


def _raising_reset(self, *, seed=None, options=None):
    if seed == 1:
        raise ValueError("bad seed 1")
    return np.zeros(1, np.float32), {}


class Raising(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(3)
    reset = _raising_reset

    def step(self, action):
        if action >= 1:
            raise KeyError(f"step with {action}")
        return np.zeros(1, np.float32), 0.0, False, False, {}


def test_worker_exceptions_keep_their_type_and_are_logged_per_env():
    env = LockstepVectorEnv([Raising] * 3, 2)
    env.reset(seed=[0, 0, 0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(KeyError, match="step with 2") as err:
            env.step(np.array([0, 1, 2]))
    assert isinstance(err.value, LockstepError)
    text = [str(w.message) for w in caught]
    # both failing envs (1 on worker 0, 2 on worker 1) are reported, then the raise
    assert sum("Received the following error from Worker-" in t for t in text) == 2
    assert "Raising the last exception back" in text[-1]
    assert env.closed
    with LockstepVectorEnv([Raising] * 2, 0) as local:       # no workers: the same
        with pytest.raises(ValueError, match="bad seed 1"):
            local.reset(seed=[1, 0])


def test_mismatched_sub_env_spaces_are_refused():
    fns = [_short()] * 3 + [lambda: gym.make("FrozenLake-v1")]
    with pytest.raises(RuntimeError, match="env 3's observation space Discrete"):
        LockstepVectorEnv(fns, 2)
    with pytest.raises(RuntimeError, match="env 3's observation space"):
        LockstepVectorEnv(fns, 0)


class Slow(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Box(0, 1, (), np.float64)

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        time.sleep(float(action))
        return np.full(1, float(action), np.float32), 0.0, False, False, {}


def test_a_wait_that_times_out_raises_and_the_env_goes_on():
    with LockstepVectorEnv([Slow] * 2, 2) as env:
        env.reset()
        env.step_async(np.array([0.0, 0.4]))
        with pytest.raises(mp.TimeoutError, match="`step_wait` has timed out after 0.05"):
            env.step_wait(timeout=0.05)
        obs, *_ = env.step(np.array([0.1, 0.2]))    # waits for the late round first
        assert obs[:, 0].tolist() == pytest.approx([0.1, 0.2])
        env.step_async(np.array([0.0, 1.0]))
        with pytest.raises(mp.TimeoutError):
            env.step_wait(timeout=0.05)
        t0 = time.monotonic()
    env.close(terminate=True)
    assert time.monotonic() - t0 < 3.0


_EXIT = """
import signal, sys
import numpy as np, gymnasium as gym
from pal_hpc.envs.lockstep import LockstepVectorEnv
signal.signal(signal.SIGTERM, lambda *a: None)   # a handler the forked workers inherit
env = LockstepVectorEnv([lambda: gym.make("CartPole-v1")] * 4, 2)
env.reset(seed=0)
if sys.argv[1] == "inflight":
    env.step_async(np.zeros(4, np.int64))
print("pids", *env.worker_pids, flush=True)
if sys.argv[1] == "raise":
    raise RuntimeError("the user's own error")
"""


@pytest.mark.parametrize("how", ["plain", "raise", "inflight"])
def test_the_interpreter_exits_with_an_env_left_open(how):
    proc = subprocess.Popen([sys.executable, "-c", _EXIT, how], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the interpreter did not exit ({how})")
    assert proc.returncode == (1 if how == "raise" else 0), err
    pids = [int(p) for p in out.split()[1:]]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)

