"""LockstepVectorEnv: equivalence with SyncVectorEnv, the async API, bad actions, and every
failure case (a raising env, a killed worker, Ctrl-C in the caller, a killed caller) with
no shared memory or process left behind."""

import os
import signal
import subprocess
import sys
import time
from contextlib import closing

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError

from conftest import ROOT
from pal_hpc.envs.lockstep import LockstepError, LockstepVectorEnv


def _make(env_id, stats=False, **kwargs):
    def fn():
        env = gym.make(env_id, **kwargs)
        return gym.wrappers.RecordEpisodeStatistics(env) if stats else env
    return fn


def _same_infos(a, b, path="infos"):
    assert a.keys() == b.keys(), (path, a.keys(), b.keys())
    for k in a:
        if isinstance(a[k], dict):
            _same_infos(a[k], b[k], f"{path}[{k!r}]")
        else:
            assert type(a[k]) is type(b[k]) and a[k].dtype == b[k].dtype, (path, k)
            if a[k].dtype.kind == "f" and k == "t":          # wall-clock episode time
                continue
            assert np.array_equal(a[k], b[k]), (path, k, a[k], b[k])


def _random_actions(space, steps, seed):
    space.seed(seed)
    return [space.sample() for _ in range(steps)]


def _compare(ours, ref, steps, seed=0, check_infos=True):
    """Step both with the same random actions; returns how many episodes ended."""
    ends = 0
    o1, i1 = ours.reset(seed=seed)
    o2, i2 = ref.reset(seed=seed)
    assert np.array_equal(o1, o2)
    if check_infos:
        _same_infos(i1, i2)
    for t, a in enumerate(_random_actions(ref.action_space, steps, seed)):
        r1, r2 = ours.step(a), ref.step(a)
        for name, x, y in zip(("obs", "reward", "terminated", "truncated"), r1[:4], r2[:4]):
            assert x.dtype == y.dtype and x.shape == y.shape, (t, name, x.dtype, y.dtype)
            assert np.array_equal(x, y), (t, name, x, y)
        if check_infos:
            _same_infos(r1[4], r2[4], f"infos at step {t}")
        ends += int(r1[2].sum() + r1[3].sum())
    return ends


@pytest.mark.parametrize("workers", [0, 1, 2, 3])
@pytest.mark.parametrize("env_id,steps", [("CartPole-v1", 300), ("Pendulum-v1", 420),
                                          ("FrozenLake-v1", 200)])
def test_steps_exactly_as_sync_vector_env(env_id, steps, workers):
    fns = [_make(env_id, stats=True)] * 5
    with LockstepVectorEnv(fns, workers) as ours, closing(gym.vector.SyncVectorEnv(fns)) as ref:
        assert ours.observation_space == ref.observation_space
        assert ours.action_space == ref.action_space
        assert ours.single_action_space == ref.single_action_space
        assert ours.metadata["autoreset_mode"] == ref.metadata["autoreset_mode"]
        # episodes ended, so autoreset and the episode-statistics infos were exercised
        assert _compare(ours, ref, steps, seed=7) >= 5


def test_episode_statistics_wrapper_on_top():
    fns = [_make("CartPole-v1")] * 4
    ours = gym.wrappers.vector.RecordEpisodeStatistics(LockstepVectorEnv(fns, 2))
    ref = gym.wrappers.vector.RecordEpisodeStatistics(gym.vector.SyncVectorEnv(fns))
    ends = 0
    ours.reset(seed=3), ref.reset(seed=3)
    for a in _random_actions(ref.action_space, 200, 3):
        *_, i1 = ours.step(a)
        *_, i2 = ref.step(a)
        _same_infos(i1, i2)
        ends += int(i1.get("_episode", np.zeros(4, bool)).sum())
    assert ends >= 10
    ours.close(), ref.close()


def test_seed_lists_options_and_partial_reset():
    fns = [_make("CartPole-v1")] * 4
    with LockstepVectorEnv(fns, 2) as ours, closing(gym.vector.SyncVectorEnv(fns)) as ref:
        seeds = [11, None, 5, 9]
        o1, _ = ours.reset(seed=seeds)
        o2, _ = ref.reset(seed=seeds)
        assert np.array_equal(o1[[0, 2, 3]], o2[[0, 2, 3]])
        ours.reset(seed=[1, 2, 3, 4]), ref.reset(seed=[1, 2, 3, 4])
        for a in _random_actions(ref.action_space, 15, 0):
            ours.step(a), ref.step(a)
        mask = np.array([True, False, False, True])
        o1, i1 = ours.reset(seed=[50, 0, 0, 51], options={"reset_mask": mask})
        o2, i2 = ref.reset(seed=[50, 0, 0, 51], options={"reset_mask": mask.copy()})
        assert np.array_equal(o1, o2)
        for a in _random_actions(ref.action_space, 50, 1):
            r1, r2 = ours.step(a), ref.step(a)
            for x, y in zip(r1[:4], r2[:4]):
                assert np.array_equal(x, y)
        with pytest.raises(ValueError, match="length must match num_envs=4 but got length=3"):
            ours.reset(seed=[1, 2, 3])
        with pytest.raises(ValueError, match="reset_mask"):
            ours.reset(options={"reset_mask": np.zeros(4, bool)})


class _SlowEnv(gym.Env):
    """Each step takes `delay` seconds and reports when it ran."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, delay=0.05, fail_at=None, bad_info=False):
        self.delay, self.fail_at, self.bad_info, self.t = delay, fail_at, bad_info, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.fail_at is not None and self.t >= self.fail_at:
            raise RuntimeError(f"boom at step {self.t}")
        start = time.monotonic()
        time.sleep(self.delay)
        info = {"ran_at": start, "ended_at": time.monotonic()}
        if self.bad_info:
            info["obj"] = object()
        return np.zeros(1, np.float32), 1.0, False, False, info


def test_step_async_lets_the_caller_compute_while_envs_step():
    with LockstepVectorEnv([lambda: _SlowEnv(0.1)] * 4, 2) as env:
        env.reset(seed=0)
        env.step_async(np.zeros(4, np.int64))
        with pytest.raises(AlreadyPendingCallError):
            env.step_async(np.zeros(4, np.int64))
        with pytest.raises(AlreadyPendingCallError):
            env.reset()
        time.sleep(0.6)                 # the caller's own work
        before_wait = time.monotonic()
        *_, infos = env.step_wait()
        # every env finished its step before the caller even asked for the results
        assert (infos["ended_at"] < before_wait).all(), (infos["ended_at"], before_wait)
        with pytest.raises(NoAsyncCallError):
            env.step_wait()


@pytest.mark.parametrize("bad,match", [
    (np.zeros(3, np.int64), r"shape \(3,\), expected \(4,\)"),
    (np.zeros((4, 1), np.int64), r"shape \(4, 1\)"),
    (np.zeros(4, np.float32), "dtype float32 .* expected integers"),
    (np.array([0, 1, 2, 0]), "env 2's action 2 is not in Discrete"),
    (np.array([0, -1, 0, 0]), "env 1's action -1"),
])
def test_bad_discrete_actions_raise_before_any_worker_steps(bad, match):
    fns = [_make("CartPole-v1")] * 4
    with LockstepVectorEnv(fns, 2) as ours, closing(gym.vector.SyncVectorEnv(fns)) as ref:
        ours.reset(seed=0), ref.reset(seed=0)
        with pytest.raises(ValueError, match=match):
            ours.step(bad)
        # nothing stepped: the env goes on exactly as one that never saw the bad call
        for a in _random_actions(ref.action_space, 30, 0):
            r1, r2 = ours.step(a), ref.step(a)
            assert np.array_equal(r1[0], r2[0])


@pytest.mark.parametrize("bad,match", [
    (np.full((3, 1), 3.0), "env 0's action"),
    (np.array([[0.0], [np.nan], [0.0]]), "env 1's action"),
    (np.array([[0.0], [0.0], [-2.5]]), "env 2's action"),
    (np.array([["a"], ["b"], ["c"]]), "dtype <U1"),
])
def test_bad_box_actions_raise(bad, match):
    with LockstepVectorEnv([_make("Pendulum-v1")] * 3, 2) as env:
        env.reset(seed=0)
        with pytest.raises(ValueError, match=match):
            env.step(bad)
        env.step(np.zeros((3, 1)))               # float64 within bounds is fine


def test_an_exception_in_a_worker_reaches_the_caller_with_its_traceback():
    env = LockstepVectorEnv([lambda: _SlowEnv(0.0)] * 2 + [lambda: _SlowEnv(0.0, fail_at=3)], 2)
    env.reset(seed=0)
    env.step(np.zeros(3, np.int64))
    env.step(np.zeros(3, np.int64))
    t0 = time.monotonic()
    with pytest.raises(LockstepError) as err:
        env.step(np.zeros(3, np.int64))
    elapsed = time.monotonic() - t0
    text = str(err.value)
    assert "worker 1 (envs 2..2) raised RuntimeError during step in env 2" in text
    assert "RuntimeError: boom at step 3" in text and "in step" in text   # the traceback
    assert elapsed < 5.0, elapsed     # promptly: no deadline is waited out
    assert env.closed
    with pytest.raises(ClosedEnvironmentError):
        env.step(np.zeros(3, np.int64))
    env.close()                                    # idempotent


def test_an_env_that_cannot_be_built_fails_the_constructor_clearly():
    def broken():
        raise OSError("no ROM here")
    with pytest.raises(LockstepError, match="(?s)no ROM here.*worker 1 \\(envs 2..3\\) raised OSError during start-up in env 3"):
        LockstepVectorEnv([_make("CartPole-v1")] * 2 + [broken] * 2, 2)


def test_an_info_that_is_not_plain_data_is_refused_by_name():
    with LockstepVectorEnv([lambda: _SlowEnv(0.0, bad_info=True)] * 2, 2) as env:
        env.reset()
        with pytest.raises(LockstepError, match=r"info of env \d\['obj'\]: a object cannot cross"):
            env.step(np.zeros(2, np.int64))


def test_infos_larger_than_the_info_area_spill_and_arrive_intact():
    class Big(_SlowEnv):
        def step(self, action):
            obs, r, te, tr, _ = super().step(action)
            return obs, r, te, tr, {"frame": np.arange(10_000 * (self.t % 3 + 1)) % 251}
    with LockstepVectorEnv([lambda: Big(0.0)] * 2, 1, info_bytes=4096) as env:
        env.reset()
        for t in range(1, 5):                 # sizes change: the spill grows and shrinks
            *_, infos = env.step(np.zeros(2, np.int64))
            want = np.arange(10_000 * (t % 3 + 1)) % 251
            assert infos["frame"].shape == (2, want.size)
            assert (infos["frame"] == want).all()


def test_a_killed_worker_is_detected_within_two_seconds():
    env = LockstepVectorEnv([lambda: _SlowEnv(0.0)] * 4, 2)
    env.reset(seed=0)
    victim = env.worker_pids[1]
    os.kill(victim, signal.SIGKILL)
    time.sleep(0.2)
    t0 = time.monotonic()
    with pytest.raises(LockstepError, match=rf"worker 1 \(pid {victim}\) was killed by SIGKILL"):
        env.step(np.zeros(4, np.int64))
    assert time.monotonic() - t0 < 2.0
    assert env.closed
    for pid in env.worker_pids if env._procs else []:
        assert not _alive(pid)


def test_a_worker_killed_while_the_caller_waits():
    env = LockstepVectorEnv([lambda: _SlowEnv(3.0)] * 2, 2)
    env.reset(seed=0)
    pids = env.worker_pids
    env.step_async(np.zeros(2, np.int64))
    time.sleep(0.3)
    os.kill(pids[0], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(LockstepError, match="was killed by SIGKILL during step"):
        env.step_wait()
    assert time.monotonic() - t0 < 2.0
    assert not any(_alive(p) for p in pids)      # the survivor was stopped too


def test_workers_report_their_busy_time():
    with LockstepVectorEnv([lambda: _SlowEnv(0.05)] * 4, 2) as env:
        env.reset(seed=0)
        t0 = time.monotonic()
        for _ in range(4):
            env.step(np.zeros(4, np.int64))
        wall = time.monotonic() - t0
        busy = env.worker_busy_seconds()
        assert busy.shape == (2,)
        # each worker stepped two 50 ms envs per round, four rounds
        assert (busy >= 0.4).all() and (busy <= wall + 0.05).all(), (busy, wall)


def test_close_is_idempotent_and_stops_every_worker():
    env = LockstepVectorEnv([_make("CartPole-v1")] * 4, 3)
    pids = env.worker_pids
    env.reset()
    env.close()
    env.close()
    assert not any(_alive(p) for p in pids)
    with pytest.raises(ClosedEnvironmentError):
        env.reset()


def test_construction_errors_name_the_field():
    with pytest.raises(ValueError, match=r"num_workers: 5; expected an int in \[0, 2\]"):
        LockstepVectorEnv([_make("CartPole-v1")] * 2, 5)
    with pytest.raises(ValueError, match="env_fns: at least one"):
        LockstepVectorEnv([], 1)
    class Odd(gym.Space):
        pass
    with pytest.raises(ValueError, match=r"the observation space .*Odd.* pass shared_memory=False"):
        LockstepVectorEnv([lambda: gym.wrappers.TransformObservation(
            gym.make("CartPole-v1"), lambda o: o, Odd())], 1)
    with pytest.raises(gym.error.Error):
        LockstepVectorEnv.from_id("NoSuchEnv-v0", 2)


def test_from_id_and_spawned_workers():
    with LockstepVectorEnv.from_id("CartPole-v1", 4, num_workers=2) as ours, \
            closing(gym.vector.SyncVectorEnv([_make("CartPole-v1")] * 4)) as ref:
        _compare(ours, ref, 60, check_infos=False)
    fns = [_make("Acrobot-v1")] * 3
    with LockstepVectorEnv(fns, 2, context="spawn") as ours, closing(gym.vector.SyncVectorEnv(fns)) as ref:
        _compare(ours, ref, 60)


def test_copy_false_returns_the_shared_batch():
    with LockstepVectorEnv([_make("CartPole-v1")] * 2, 1, copy=False) as env:
        o1, _ = env.reset(seed=0)
        o2, *_ = env.step(np.zeros(2, np.int64))
        assert o1 is o2 or np.shares_memory(o1, o2)


# The MPI libraries' own intranode files (MPICH's, UCX's, Open MPI's, Intel MPI's): they
# belong to MPI jobs that may run beside this test, on the other pytest worker too; the
# lockstep env uses memfd mappings and never MPI.
MPI_SHM_PREFIXES = ("mpich_shm_", "mpich_shar_", "ucx_", "sm_segment.", "Intel_MPI_")


def _shm():
    """/dev/shm, without the MPI libraries' files."""
    return {f for f in os.listdir("/dev/shm") if not f.startswith(MPI_SHM_PREFIXES)}


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


# The caller takes Ctrl-C as a Python program in a terminal does (KeyboardInterrupt),
# whatever it inherited: once, in CI, it started with SIGINT and SIGQUIT ignored (what
# glibc's system() leaves in a parent while its child runs), never stopped, and the test
# waited out its 30 s while the caller and its workers ran on.
_CALLER = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
import numpy as np, gymnasium as gym
from pal_hpc.envs.lockstep import LockstepVectorEnv
env = LockstepVectorEnv([lambda: gym.make("CartPole-v1")] * 4, 2)
env.reset(seed=0)
print("pids", *env.worker_pids, flush=True)
while True:
    env.step(np.zeros(4, np.int64))
"""


def _start_caller():
    proc = subprocess.Popen([sys.executable, "-c", _CALLER], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    line = proc.stdout.readline()
    assert line.startswith("pids"), line + proc.stderr.read()
    return proc, [int(p) for p in line.split()[1:]]


def _wait_gone(pids, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return not any(_alive(p) for p in pids)


def test_ctrl_c_in_the_caller_leaves_no_process_or_segment():
    shm_before = _shm()
    proc, pids = _start_caller()
    try:
        time.sleep(0.5)
        os.killpg(os.getpgid(proc.pid), 0)             # sanity: the group exists
        proc.send_signal(signal.SIGINT)                # what Ctrl-C sends to the caller
        _, err = proc.communicate(timeout=30)
        assert "KeyboardInterrupt" in err, err
        assert _wait_gone(pids, 5.0), pids
        assert _shm() == shm_before
    finally:                                           # nothing left running on a failure
        for pid in (proc.pid, *pids):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_a_killed_caller_takes_its_workers_with_it():
    shm_before = _shm()
    proc, pids = _start_caller()
    time.sleep(0.3)
    proc.kill()
    proc.wait(timeout=10)
    assert _wait_gone(pids, 5.0), pids
    assert _shm() == shm_before


def test_no_segment_is_left_after_close_or_a_crash():
    shm_before = _shm()
    env = LockstepVectorEnv([_make("CartPole-v1")] * 2, 2)
    assert _shm() == shm_before      # memfd: never a /dev/shm file
    env.close()
    env = LockstepVectorEnv([lambda: _SlowEnv(0.0, fail_at=1)] * 2, 2)
    env.reset()
    with pytest.raises(LockstepError):
        env.step(np.zeros(2, np.int64))
    assert _shm() == shm_before


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs,share", [(1, 0), (4, 0), (1, 3), (3, 3), (4, 4)])
def test_mpi_ranks_attach_to_the_node_window(mpi, nprocs, share):
    """With a master share (`master_envs`) too: the master steps envs [0, share)."""
    proc = mpi(nprocs, ROOT / "tests/mpi/lockstep_attach.py", str(share), timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ranks={nprocs} ok=True" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 3])
def test_attach_ends_on_every_rank_when_the_master_cannot_build_its_env(mpi, nprocs):
    proc = mpi(nprocs, ROOT / "tests/mpi/lockstep_attach.py", "fail", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ranks={nprocs} ok=True" in proc.stdout, proc.stdout + proc.stderr


def test_atari_frames_step_exactly_as_sync_vector_env():
    from pal_hpc.envs import make_env
    fns = [lambda: make_env("ALE/Pong-v5", seed=0)] * 3
    with LockstepVectorEnv(fns, 2) as ours, closing(gym.vector.SyncVectorEnv(fns)) as ref:
        assert ours.single_observation_space.dtype == np.uint8
        assert ours.observation_space.shape == (3, 4, 84, 84)
        _compare(ours, ref, 40, seed=3)      # uint8 frames and ALE's infos (lives, frames)


def test_workers_are_pinned_one_core_each_unless_asked_not_to():
    cores = sorted(os.sched_getaffinity(0))
    with LockstepVectorEnv([_make("CartPole-v1")] * 3, 3) as env:
        pinned = [os.sched_getaffinity(p) for p in env.worker_pids]
        if len(cores) > 1:
            assert pinned == [{cores[w % len(cores)]} for w in range(3)]
    with LockstepVectorEnv([_make("CartPole-v1")] * 2, 2, pin_workers=False) as env:
        assert all(os.sched_getaffinity(p) == set(cores) for p in env.worker_pids)
