"""LockstepVectorEnv with every kind of gymnasium space: fixed-shape composites (Tuple, Dict)
as shared arrays per leaf, variable-size spaces (Sequence, Graph, Text, OneOf, custom) in
the binary encoding, each checked value for value against SyncVectorEnv."""

from contextlib import closing
from copy import deepcopy

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.spaces import Box, Dict, Discrete, Graph, MultiBinary, OneOf, Sequence, Text, Tuple
from gymnasium.utils.env_checker import data_equivalence

from pal_hpc.envs import codec
from pal_hpc.envs.lockstep import LockstepVectorEnv
from pal_hpc.envs.lockstep_spaces import SpacePlan, is_fixed


class SpaceEnv(gym.Env):
    """Observations sampled from `obs_space` (seeded by reset); episodes of 7 steps;
    the action is echoed in the info so the test sees what the env received."""

    def __init__(self, obs_space, act_space):
        self.observation_space, self.action_space, self.t = obs_space, act_space, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(1 << 30)))
        self.t = 0
        return self.observation_space.sample(), {"t": 0}

    def step(self, action):
        assert action in self.action_space, action
        self.t += 1
        return (self.observation_space.sample(), float(self.t), self.t % 7 == 0, False,
                {"t": self.t, "saw": [_plain(action)]})


def _plain(a):
    if isinstance(a, tuple):
        return tuple(_plain(x) for x in a)
    if isinstance(a, dict):
        return {k: _plain(v) for k, v in a.items()}
    return a


def _run_both(fns, steps, workers, **kwargs):
    with LockstepVectorEnv(fns, workers, **kwargs) as ours, \
            closing(gym.vector.SyncVectorEnv(fns, **{k: v for k, v in kwargs.items()
                                                      if k == "autoreset_mode"})) as ref:
        assert ours.observation_space == ref.observation_space
        assert ours.action_space == ref.action_space
        o1, i1 = ours.reset(seed=3)
        o2, i2 = ref.reset(seed=3)
        assert data_equivalence(o1, o2) and data_equivalence(i1, i2)
        ref.action_space.seed(5)
        for t in range(steps):
            a = ref.action_space.sample()
            r1, r2 = ours.step(a), ref.step(a)
            for k, (x, y) in enumerate(zip(r1, r2)):
                assert data_equivalence(x, y), (t, k, x, y)
        return r1


FIXED = [
    Tuple((Discrete(5), Box(-1, 1, (2,), np.float64))),
    Dict({"pos": Dict({"x": Discrete(9), "y": Box(0, 1, (3,))}),
          "bits": MultiBinary(4), "v": Tuple((Discrete(3, start=-1), Box(0, 255, (2, 2), np.uint8)))}),
]
VARIABLE = [
    Sequence(Discrete(4)),
    Sequence(Box(0, 1, (2,)), stack=True),
    Graph(node_space=Box(-1, 1, (2,)), edge_space=Discrete(3)),
    Text(8),
    OneOf([Discrete(3), Box(0, 1, (2,))]),
    Dict({"g": Graph(node_space=Discrete(3), edge_space=None), "b": Box(0, 1, (2,))}),
]


# Ids by position, the same in every process (parallel pytest workers compare them).
SPACES = FIXED + VARIABLE


@pytest.mark.parametrize("space", SPACES, ids=[f"{type(s).__name__}{k}" for k, s in enumerate(SPACES)])
def test_obs_and_action_spaces_step_exactly_as_sync(space):
    plan = SpacePlan(space, 3)
    assert plan.fixed == is_fixed(space) == (space in FIXED)
    fns = [lambda: SpaceEnv(deepcopy(space), deepcopy(space))] * 3   # a space each: its rng
    last = _run_both(fns, 15, 2)
    if plan.fixed:             # fixed-shape: one shared array per leaf, nothing encoded
        assert len(plan.leaves) == len(gym.spaces.flatten_space(space).shape) or plan.leaves
        assert last[0] is not None


def test_blackjack_tuple_observations_match_sync_and_async():
    fns = [lambda: gym.make("Blackjack-v1")] * 4
    last = _run_both(fns, 200, 2)
    assert isinstance(last[0], tuple) and [a.dtype for a in last[0]] == [np.int64] * 3
    with LockstepVectorEnv(fns, 2) as ours, closing(gym.vector.AsyncVectorEnv(fns)) as ref:
        o1, _ = ours.reset(seed=11)
        o2, _ = ref.reset(seed=11)
        assert data_equivalence(o1, o2)
        for a in [np.array([0, 1, 1, 0])] * 5:
            assert data_equivalence(ours.step(a)[:4], ref.step(a)[:4])


def test_copy_false_returns_the_shared_leaves_of_a_tuple():
    with LockstepVectorEnv([lambda: gym.make("Blackjack-v1")] * 2, 1, copy=False) as env:
        o1, _ = env.reset(seed=0)
        o2, *_ = env.step(np.zeros(2, np.int64))
        assert all(np.shares_memory(a, b) for a, b in zip(o1, o2))


def test_bool_box_actions():
    space = Box(low=np.array([0, 0, 1]), high=np.array([1, 0, 1]), dtype=np.bool_)
    fns = [lambda: SpaceEnv(Discrete(2), space)] * 3
    _run_both(fns, 10, 2)
    with LockstepVectorEnv(fns, 2) as env:
        env.reset()
        with pytest.raises(ValueError, match="env 1's action"):
            env.step(np.array([[0, 0, 1], [1, 1, 1], [1, 0, 1]], bool))


def test_large_variable_observations_spill_and_arrive_intact():
    space = Sequence(Box(0, 1, (64,)), stack=True)

    class Long(SpaceEnv):
        def step(self, action):
            obs, *rest = super().step(action)
            return np.ones((2000 + self.t, 64), np.float32) * self.t, *rest
    with LockstepVectorEnv([lambda: Long(space, Discrete(2))] * 2, 1, info_bytes=4096) as env:
        env.reset(seed=0)
        for t in range(1, 4):
            obs, *_ = env.step(np.zeros(2, np.int64))
            assert [o.shape for o in obs] == [(2000 + t, 64)] * 2 and obs[1][5, 7] == t


class Custom(gym.Space):
    """A space gymnasium does not know: values are strings."""

    def sample(self, mask=None, probability=None):
        return "x"

    def contains(self, x):
        return isinstance(x, str)

    def __eq__(self, other):
        return isinstance(other, Custom)


class Echo(gym.Env):
    observation_space, action_space = Custom(), Custom()

    def reset(self, *, seed=None, options=None):
        return "reset", {}

    def step(self, action):
        return f"step({action})", 0.0, False, False, {}


def test_custom_spaces_need_shared_memory_false():
    with pytest.raises(ValueError, match="shared_memory=False"):
        LockstepVectorEnv([Echo] * 2, 2)
    with LockstepVectorEnv([Echo] * 3, 2, shared_memory=False) as env:
        assert env.reset()[0] == ("reset",) * 3
        assert env.step(("a", "b", "c"))[0] == ("step(a)", "step(b)", "step(c)")


def test_codec_carries_graphs_generators_and_big_ints():
    g = Graph(node_space=Box(-1, 1, (2,)), edge_space=Discrete(3)).sample()
    assert data_equivalence(codec.decode(codec.encode(g)), g)
    rng = np.random.default_rng(7)
    rng.random(3)
    copy = codec.decode(codec.encode(rng))
    assert copy.random() == rng.random()
    assert codec.decode(codec.encode([1 << 100, -(1 << 70)])) == [1 << 100, -(1 << 70)]
    with pytest.raises(codec.CodecError, match="a object cannot cross"):
        codec.encode({"x": object()})
