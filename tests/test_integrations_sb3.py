"""pal_hpc.integrations.sb3: the prioritized buffer under SB3's API, and DQN/SAC/TD3 on it."""

import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch as th
import torch.nn.functional as F
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.type_aliases import ReplayBufferSamples

from pal_hpc.integrations.sb3 import DQN, SAC, TD3, PrioritizedReplayBuffer

# One intra-op thread, as every pal_hpc rank runs: on a shared 2-core machine torch's
# default team of threads makes these small networks many times slower.
th.set_num_threads(1)

OBS = spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACT = spaces.Discrete(2)


def filled(n_rows=10, n_envs=2, room=0, **kw):
    """A buffer (`room` rows still free) whose observation 0 holds the flat row number
    r * n_envs + e."""
    buf = PrioritizedReplayBuffer((n_rows + room) * n_envs, OBS, ACT, device="cpu",
                                  n_envs=n_envs, **kw)
    for r in range(n_rows):
        flat = np.arange(r * n_envs, (r + 1) * n_envs, dtype=np.float32)
        obs = np.stack([flat, flat, flat], 1)
        buf.add(obs, obs + 0.5, np.zeros(n_envs), flat, np.zeros(n_envs), [{}] * n_envs)
    return buf


def test_sample_rows_match_storage_and_weights():
    buf = filled()
    data = buf.sample(64)
    assert isinstance(data, ReplayBufferSamples) and len(data) == len(ReplayBufferSamples._fields)
    np.testing.assert_array_equal(data.observations[:, 0].numpy(), data.indices)
    np.testing.assert_array_equal(data.rewards[:, 0].numpy(), data.indices)
    np.testing.assert_array_equal(data.next_observations[:, 0].numpy(), data.indices + 0.5)
    assert data.weights.shape == (64, 1)
    # every row has the same (initial) priority: all weights are 1
    np.testing.assert_allclose(data.weights.numpy(), 1.0)


def test_new_rows_get_max_priority_and_priorities_in_storage_order():
    buf = filled(n_rows=3, n_envs=2, room=2, eps=1e-3)
    np.testing.assert_allclose(buf.priorities(), np.ones(6))
    buf.update_priorities([1, 4], [2.0, -5.0])   # |TD| is taken
    np.testing.assert_allclose(buf.priorities(), [1, 2.001, 1, 1, 5.001, 1])
    obs = np.zeros((2, 3), np.float32)
    buf.add(obs, obs, np.zeros(2), np.zeros(2), np.zeros(2), [{}, {}])
    assert buf.priorities().shape == (8,)
    np.testing.assert_allclose(buf.priorities()[6:], 5.001)
    for _ in range(2):   # full, then the oldest row is overwritten at the max priority
        buf.add(obs, obs, np.zeros(2), np.zeros(2), np.zeros(2), [{}, {}])
    np.testing.assert_allclose(buf.priorities(), [5.001] * 2 + [1, 1, 5.001, 1] + [5.001] * 4)


def test_proportional_sampling_and_is_weights():
    buf = filled(n_rows=4, n_envs=1, alpha=0.7, beta=0.5, eps=0.0)
    p = np.array([0.5, 1.0, 2.0, 4.0])
    buf.update_priorities(np.arange(4), p)
    np.random.seed(0)
    counts = np.zeros(4)
    for _ in range(200):
        data = buf.sample(100)
        counts += np.bincount(data.indices, minlength=4)
        pa = p[data.indices] ** 0.7
        np.testing.assert_allclose(data.weights[:, 0].numpy(), (pa / p.min() ** 0.7) ** -0.5,
                                   rtol=1e-5)
    expected = p ** 0.7 / (p ** 0.7).sum() * counts.sum()
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 16.3, (counts, expected)   # df=3, p=0.001


def test_timeouts_handled_as_sb3():
    for handle, want in ((True, 0.0), (False, 1.0)):
        buf = PrioritizedReplayBuffer(4, OBS, ACT, device="cpu",
                                      handle_timeout_termination=handle)
        obs = np.zeros((1, 3), np.float32)
        buf.add(obs, obs, np.zeros(1), np.zeros(1), np.ones(1), [{"TimeLimit.truncated": True}])
        assert float(buf.sample(4).dones.max()) == want


def test_refuses_what_it_does_not_support():
    with pytest.raises(ValueError, match="optimize_memory_usage"):
        PrioritizedReplayBuffer(10, OBS, ACT, optimize_memory_usage=True,
                                handle_timeout_termination=False)
    with pytest.raises(ValueError, match="optimize_memory_usage"):
        DQN("MlpPolicy", "CartPole-v1", optimize_memory_usage=True,
            replay_buffer_kwargs=dict(handle_timeout_termination=False))
    with pytest.raises(TypeError, match="Dict"):
        PrioritizedReplayBuffer(10, spaces.Dict({"a": OBS}), ACT)
    with pytest.raises(TypeError, match="PrioritizedReplayBuffer"):
        DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=ReplayBuffer)
    with pytest.raises(ValueError, match="n_steps"):
        DQN("MlpPolicy", "CartPole-v1", n_steps=3)


def test_bad_input_raises_the_tree_errors_and_changes_nothing():
    with pytest.raises(ValueError, match="buffer_size"):
        PrioritizedReplayBuffer(0, OBS, ACT)
    with pytest.raises(MemoryError, match=str(2**60)):       # before SB3 allocates anything
        PrioritizedReplayBuffer(2**60, OBS, ACT)
    with pytest.raises(ValueError, match="alpha"):
        PrioritizedReplayBuffer(10, OBS, ACT, alpha=-1.0)
    with pytest.raises(ValueError, match="beta"):
        PrioritizedReplayBuffer(10, OBS, ACT, beta=float("nan"))
    empty = PrioritizedReplayBuffer(10, OBS, ACT, device="cpu")
    with pytest.raises(ValueError, match="every priority in the tree is zero"):
        empty.sample(4)
    buf = filled(n_rows=5, n_envs=1)
    before = buf.priorities()
    with pytest.raises(ValueError, match=r"priorities\[1\] = nan"):
        buf.update_priorities([0, 1], [3.0, float("nan")])
    with pytest.raises(ValueError, match=r"priorities\[0\] = inf"):
        buf.update_priorities([0], [float("inf")])
    with pytest.raises(IndexError, match=r"indices\[1\] = 5 is not a stored row"):
        buf.update_priorities([0, 5], [3.0, 3.0])
    with pytest.raises(IndexError, match=r"indices\[0\] = -1"):
        buf.update_priorities([-1], [3.0])
    with pytest.raises(TypeError, match="integers"):
        buf.update_priorities([0.5], [3.0])
    with pytest.raises(ValueError, match="batch_size"):
        buf.sample(0)
    np.testing.assert_array_equal(buf.priorities(), before)


def test_pickles_for_save_replay_buffer():
    buf = filled(n_rows=4, n_envs=1)
    buf.update_priorities([2], [7.0])
    back = pickle.loads(pickle.dumps(buf))
    np.testing.assert_array_equal(back.priorities(), buf.priorities())
    assert back.sample(8).weights.shape == (8, 1)


def test_dqn_train_weights_loss_and_sets_priorities():
    model = DQN("MlpPolicy", "CartPole-v1", learning_starts=0, batch_size=16, seed=3,
                device="cpu", replay_buffer_kwargs=dict(alpha=1.0, beta=0.6, eps=1e-6))
    model.learn(200)   # fills the buffer and trains a little
    buf = model.replay_buffer
    assert buf.beta == pytest.approx(1.0)           # annealed to 1 over learn()
    assert len(np.unique(buf.priorities())) > 10    # |TD| priorities, not the initial max
    buf.beta = 0.6
    model._current_progress_remaining = 1.0        # so train() anneals back to beta_start
    np.random.seed(11)
    data = buf.sample(16)
    with th.no_grad():
        next_q = model.q_net_target(data.next_observations).max(dim=1).values.reshape(-1, 1)
        target = data.rewards + (1 - data.dones) * model.gamma * next_q
        q = th.gather(model.q_net(data.observations), 1, data.actions.long())
        want_loss = (data.weights * F.smooth_l1_loss(q, target, reduction="none")).mean()
    assert not np.allclose(data.weights.numpy(), 1.0)
    np.random.seed(11)
    model.train(gradient_steps=1, batch_size=16)
    assert model.logger.name_to_value["train/loss"] == pytest.approx(float(want_loss), rel=1e-5)
    np.testing.assert_allclose(buf.priorities()[data.indices],
                               (q - target).abs().numpy()[:, 0] + 1e-6, rtol=1e-5)


@pytest.mark.parametrize("cls", [SAC, TD3])
def test_actor_critic_learn_updates_priorities(cls):
    model = cls("MlpPolicy", "Pendulum-v1", learning_starts=20, buffer_size=500, batch_size=32,
                seed=0, device="cpu")
    model.learn(120)
    prio = model.replay_buffer.priorities()
    assert prio.shape == (120,)
    assert len(np.unique(prio)) > 20 and np.all(prio > 0)
    assert model.replay_buffer.beta == pytest.approx(1.0)
    assert model.logger.name_to_value["train/per_beta"] > 0.4


def test_dqn_usable_by_env_id_and_vec_env():
    model = DQN("MlpPolicy", gym.make("CartPole-v1"), learning_starts=10, seed=0, device="cpu")
    assert isinstance(model.replay_buffer, PrioritizedReplayBuffer)
    from stable_baselines3.common.env_util import make_vec_env
    model = DQN("MlpPolicy", make_vec_env("CartPole-v1", n_envs=2), learning_starts=10,
                train_freq=4, batch_size=8, seed=0, device="cpu")
    model.learn(64)
    assert model.replay_buffer.n_envs == 2
    assert model.replay_buffer.priorities().shape == (64,)
