"""LockstepAgents: agents' policies evaluated in lockstep beside a PettingZoo ParallelEnv.
The gathered actions equal the policies evaluated here bit for bit, each agent keeps its
own weights, agents that PettingZoo removes are not asked, a raising policy and a killed
worker reach the caller, bad input is refused naming the field, and nothing is left
behind (processes, /dev/shm, memfds, an interpreter that does not exit)."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo.utils.env import ParallelEnv

from conftest import ROOT
from test_lockstep import _wait_gone
from pal_hpc.envs.lockstep_agents import LockstepAgents
from pal_hpc.envs.lockstep_protocol import LockstepError

OBS, ACTIONS = 6, 7


class Relay(ParallelEnv):
    """n agents, each seeing a seeded random (OBS,) float32 vector (or, with `same`,
    all the same one); agent k is done after `lives[k]` steps (None: never), and the
    episode ends when none is left or after `horizon` steps."""

    metadata = {"name": "relay"}

    def __init__(self, n=5, lives=None, same=False, horizon=50):
        self.possible_agents = [f"a{k}" for k in range(n)]
        self.lives = dict(zip(self.possible_agents, lives or [None] * n))
        self.same, self.horizon = same, horizon
        self.rng = np.random.default_rng(0)
        self.seen = []                    # the actions env.step received, per step

    def observation_space(self, agent):
        return spaces.Box(-1, 1, (OBS,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(ACTIONS)

    def _obs(self):
        if self.same:
            x = self.rng.standard_normal(OBS).astype(np.float32)
            return {a: x.copy() for a in self.agents}
        return {a: self.rng.standard_normal(OBS).astype(np.float32) for a in self.agents}

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents, self.t = list(self.possible_agents), 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)
        self.seen.append(dict(actions))
        self.t += 1
        obs = self._obs()
        term = {a: self.lives[a] is not None and self.t >= self.lives[a] for a in self.agents}
        trunc = {a: self.t >= self.horizon for a in self.agents}
        rew = {a: 0.0 for a in self.agents}
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rew, term, trunc, {a: {} for a in obs}


class MLP:
    """obs -> 64 ReLU -> ACTIONS, argmax, weights from `seed`; counts its calls."""

    def __init__(self, seed, fail_at=None):
        rng = np.random.default_rng(seed)
        self.w1 = rng.standard_normal((OBS, 64)).astype(np.float32)
        self.w2 = rng.standard_normal((64, ACTIONS)).astype(np.float32)
        self.calls, self.fail_at = 0, fail_at

    def __call__(self, obs):
        self.calls += 1
        if self.calls == self.fail_at:
            raise ValueError(f"policy broke at call {self.calls}")
        return int(np.argmax(np.maximum(obs @ self.w1, 0) @ self.w2))

    def q(self, obs):
        return np.maximum(obs @ self.w1, 0) @ self.w2


class Maker:
    def __init__(self, seed, fail_at=None):
        self.seed, self.fail_at = seed, fail_at

    def __call__(self):
        return MLP(self.seed, self.fail_at)


def _fns(env, **kw):
    return {a: Maker(100 + k, **kw) for k, a in enumerate(env.possible_agents)}


def _shm():
    """What a leak of ours would leave in /dev/shm (other jobs' files come and go on a
    shared machine: MPICH's, Ray's); the lockstep memory is a memfd and never there."""
    return {f for f in os.listdir("/dev/shm") if "lockstep" in f or f.startswith(("psm_", "pal"))}


def _memfds():
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if "pal_lockstep" in os.readlink(f"/proc/self/fd/{fd}"):
                out.append(fd)
        except OSError:
            pass
    return out


def _gone(pids, seconds=5.0):
    return _wait_gone(pids, seconds)


@pytest.mark.parametrize("workers,master", [(0, 0), (1, 0), (2, 0), (2, 2), (5, 0)])
def test_gathered_actions_equal_the_policies_evaluated_here(workers, master):
    env = Relay(5)
    here = {a: fn() for a, fn in _fns(env).items()}
    with LockstepAgents(env, _fns(env), workers, master_agents=master) as runner:
        obs, _ = env.reset(seed=3)
        for _ in range(30):
            got = runner.act(obs)
            want = {a: here[a](obs[a]) for a in obs}
            assert got == want and all(type(v) is int for v in got.values())
            obs, *_ = env.step(got)
        # and the values the policies computed, bit for bit, where they live
        q = runner.call("q", obs["a0"])
        for a in env.possible_agents:
            assert np.array_equal(q[a], here[a].q(obs["a0"])), a
            assert q[a].dtype == np.float32


def test_each_agent_keeps_its_own_weights():
    env = Relay(4, same=True)               # every agent sees the same observation
    with LockstepAgents(env, _fns(env), 2) as runner:
        obs, _ = env.reset(seed=0)
        joint = []
        for _ in range(40):
            acts = runner.act(obs)
            joint.append(acts)
            obs, *_ = env.step(acts)
        w1 = runner.call("w1")
    per_agent = {a: [j[a] for j in joint] for a in env.possible_agents}
    assert len({tuple(v) for v in per_agent.values()}) == 4     # all four differ
    assert not np.array_equal(w1["a0"], w1["a1"])
    assert np.array_equal(w1["a2"], MLP(102).w1)


def test_agents_that_finish_are_not_asked():
    env = Relay(5, lives=[3, None, 1, 6, None], horizon=8)
    with LockstepAgents(env, _fns(env), 2) as runner:
        res = runner.run(20, seed=1)
        calls = runner.call("calls")
    assert res["steps"] == 20 and res["episodes"] == 3      # 8 + 8 + 4 steps
    # each episode: an agent acts until it is done (or the horizon)
    per_episode = {"a0": 3, "a1": 8, "a2": 1, "a3": 6, "a4": 8}
    last = {"a0": 3, "a1": 4, "a2": 1, "a3": 4, "a4": 4}     # the third episode: 4 steps
    assert calls == {a: 2 * per_episode[a] + last[a] for a in per_episode}
    assert [len(s) for s in env.seen[:8]] == [5, 4, 4, 3, 3, 3, 2, 2]


def test_a_raising_policy_reaches_the_caller_with_its_traceback():
    env = Relay(4)
    fns = _fns(env)
    fns["a3"] = Maker(7, fail_at=3)
    shm = _shm()
    runner = LockstepAgents(env, fns, 2)
    pids = runner.worker_pids
    obs, _ = env.reset(seed=0)
    runner.act(obs)
    runner.act(obs)
    with pytest.raises(ValueError) as info:
        runner.act(obs)
    text = str(info.value)
    assert isinstance(info.value, LockstepError)
    assert "policy broke at call 3" in text and "agent 'a3'" in text
    assert "worker 1 (agents 'a2'..'a3')" in text
    assert "Traceback" in text and "in __call__" in text       # the worker's traceback
    assert _gone(pids) and _shm() == shm and not _memfds()
    with pytest.raises(LockstepError, match="closed"):
        runner.act(obs)


@pytest.mark.parametrize("workers,master", [(3, 0), (2, 1), (0, 0)])
def test_a_policy_that_fails_to_build_is_reported_at_start_up(workers, master):
    env = Relay(3)
    fns = _fns(env)
    fns["a1" if master == 0 else "a0"] = lambda: 1 / 0
    match = "during start-up of agent 'a1'" if workers and not master else "division"
    with pytest.raises(ZeroDivisionError, match=match):
        LockstepAgents(env, fns, workers, master_agents=master)
    assert not _memfds()


def test_a_killed_worker_is_detected():
    env = Relay(4)
    runner = LockstepAgents(env, _fns(env), 2)
    obs, _ = env.reset(seed=0)
    runner.act(obs)
    pids = runner.worker_pids
    os.kill(pids[1], signal.SIGKILL)
    time.sleep(0.2)
    with pytest.raises(LockstepError, match=r"worker 1 \(pid \d+, agents 'a2'..'a3'\) "
                                            r"was killed by SIGKILL during step"):
        runner.act(obs)
    assert _gone(pids) and not _memfds()


class _Odd(Relay):
    def __init__(self, obs_space=None, act_space=None):
        super().__init__(2)
        self._o, self._a = obs_space, act_space

    def observation_space(self, agent):
        return self._o if self._o is not None and agent == "a1" else super().observation_space(agent)

    def action_space(self, agent):
        return self._a if self._a is not None and agent == "a1" else super().action_space(agent)


@pytest.mark.parametrize("make,kwargs,match", [
    (lambda: _Odd(obs_space=spaces.Discrete(3)), {}, r"observation_space\('a1'\): Discrete"),
    (lambda: _Odd(obs_space=spaces.Dict({"x": spaces.Box(0, 1, (2,))})), {},
     r"observation_space\('a1'\): Dict"),
    (lambda: _Odd(act_space=spaces.Box(0, 1, (2,))), {}, r"action_space\('a1'\)"),
    (lambda: Relay(3), {"num_workers": 4}, r"num_workers: 4; expected an int in \[0, 3\]"),
    (lambda: Relay(3), {"num_workers": -1}, r"num_workers: -1"),
    (lambda: Relay(3), {"num_workers": True}, r"num_workers: True"),
    (lambda: Relay(3), {"num_workers": 2, "master_agents": 2}, r"master_agents: 2"),
])
def test_bad_spaces_and_counts_are_refused_naming_the_field(make, kwargs, match):
    env = make()
    with pytest.raises(ValueError, match=match):
        LockstepAgents(env, _fns(env), **kwargs)
    assert not _memfds()


def test_bad_policies_and_observations_are_refused_naming_the_field():
    env = Relay(3)
    with pytest.raises(ValueError, match=r"policy_fns: unknown agent 'zz'"):
        LockstepAgents(env, {**_fns(env), "zz": Maker(0)}, 1)
    with pytest.raises(ValueError, match=r"policy_fns: no policy for agent\(s\) \['a2'\]"):
        LockstepAgents(env, {a: Maker(0) for a in ("a0", "a1")}, 1)
    with pytest.raises(ValueError, match=r"policy_fns\['a1'\]: 3 is not callable"):
        LockstepAgents(env, {**_fns(env), "a1": 3}, 1)
    with LockstepAgents(env, _fns(env), 1) as runner:
        obs, _ = env.reset(seed=0)
        with pytest.raises(ValueError, match=r"observations: unknown agent 'b7'"):
            runner.act({**obs, "b7": obs["a0"]})
        with pytest.raises(ValueError, match=r"observations\['a2'\]: shape \(5,\)"):
            runner.act({**obs, "a2": obs["a2"][:5]})
        assert runner.act(obs) == {a: MLP(100 + k)(obs[a]) for k, a in enumerate(obs)}


def test_spawned_workers_give_the_same_actions():
    env = Relay(3)
    here = {a: fn() for a, fn in _fns(env).items()}
    with LockstepAgents(env, _fns(env), 1, context="spawn") as runner:
        obs, _ = env.reset(seed=5)
        for _ in range(5):
            got = runner.act(obs)
            assert got == {a: here[a](obs[a]) for a in obs}
            obs, *_ = env.step(got)


def test_a_real_pettingzoo_env_magent2_battle():
    """MAgent2's battle (12x12: 2 agents a side), 13x13x5 float32 views, Discrete(21)."""
    from magent2.environments import battle_v4

    env = battle_v4.parallel_env(map_size=12, max_cycles=60)
    rng = np.random.default_rng(0)
    dims = {a: int(np.prod(env.observation_space(a).shape)) for a in env.possible_agents}

    fns = {a: _Linear(dims[a], 21, int(rng.integers(1 << 30))) for a in env.possible_agents}
    here = {a: fn() for a, fn in fns.items()}
    with LockstepAgents(env, fns, 2) as runner:
        obs, _ = env.reset(seed=0)
        for _ in range(60):
            if not env.agents:
                break
            live = {a: obs[a] for a in env.agents}
            got = runner.act(live)
            assert got == {a: here[a](live[a]) for a in live}
            obs, *_ = env.step(got)
    env.close()


class _Linear:
    def __init__(self, dim, n, seed):
        self.dim, self.n, self.seed = dim, n, seed

    def __call__(self):
        w = np.random.default_rng(self.seed).standard_normal((self.dim, self.n)).astype(np.float32)
        return lambda obs: int(np.argmax(obs.reshape(-1) @ w))


_EXIT = """
import sys
sys.path.insert(0, "tests")
from test_lockstep_agents import Relay, _fns
from pal_hpc.envs.lockstep_agents import LockstepAgents
env = Relay(4)
runner = LockstepAgents(env, _fns(env), 2)
obs, _ = env.reset(seed=0)
runner.act(obs)
print("pids", *runner.worker_pids, flush=True)
if sys.argv[1] == "raise":
    raise RuntimeError("the user's own error")
"""


@pytest.mark.parametrize("how", ["plain", "raise"])
def test_the_interpreter_exits_with_a_runner_left_open(how):
    shm = _shm()
    proc = subprocess.Popen([sys.executable, "-c", _EXIT, how], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the interpreter did not exit ({how})")
    assert proc.returncode == (1 if how == "raise" else 0), err
    assert _gone([int(p) for p in out.split()[1:]]) and _shm() == shm


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs,mode", [(1, "0"), (3, "0"), (3, "2"), (1, "raise"),
                                         (3, "raise"), (1, "envfail"), (3, "envfail")])
def test_mpi_ranks_attach_to_the_node_window(mpi, nprocs, mode):
    proc = mpi(nprocs, ROOT / "tests/mpi/lockstep_agents_attach.py", mode, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ranks={nprocs} ok=True" in proc.stdout, proc.stdout + proc.stderr


def test_workers_are_pinned_only_while_they_leave_the_caller_a_core():
    cores = sorted(os.sched_getaffinity(0))
    env = Relay(len(cores) + 1)
    with LockstepAgents(env, _fns(env), len(cores)) as runner:       # no core left over
        assert all(os.sched_getaffinity(p) == set(cores) for p in runner.worker_pids)
    if len(cores) > 1:
        with LockstepAgents(env, _fns(env), len(cores) - 1) as runner:
            assert all(len(os.sched_getaffinity(p)) == 1 for p in runner.worker_pids)
        with LockstepAgents(env, _fns(env), len(cores), pin_workers=True) as runner:
            assert all(len(os.sched_getaffinity(p)) == 1 for p in runner.worker_pids)
