"""DQN maths: shapes, acting and the actors' policy, the TD target against hand
computation, the split gradient step against a plain optimizer step, target syncs,
determinism, and a short CartPole learning check."""

from __future__ import annotations

import copy
from collections import deque

import gymnasium as gym
import numpy as np
import pytest
import torch

from pal_hpc.algos import ALGOS, DQN, QNetwork
from pal_hpc.algos.configs import DQNSpec
from pal_hpc.algos.dqn import DQNConfig, DQNPolicy, actor_epsilon, epsilon_greedy
from pal_hpc.algos.acting import QPolicy


def make(obs_shape=(4,), n_actions=2, seed=0, **config_fields) -> DQN:
    """A DQN on a Box observation space of `obs_shape` and `n_actions` discrete actions."""
    obs_space = gym.spaces.Box(-np.inf, np.inf, obs_shape, np.float32)
    return DQN(obs_space, gym.spaces.Discrete(n_actions), DQNConfig(**config_fields),
               seed=seed)


def grads(dqn: DQN, batch: dict, metrics: bool = True) -> tuple[np.ndarray, dict, np.ndarray]:
    """(gradient, metrics, priorities) of the "q" phase, into a fresh buffer."""
    out = np.full(dqn.phase_size("q"), np.nan, np.float32)
    stats, prio = dqn.compute_gradients("q", batch, out, metrics=metrics)
    return out, stats, prio


def step(dqn: DQN, batch: dict) -> None:
    """One update on one learner (no Allreduce)."""
    for phase in dqn.phases(dqn.updates):
        dqn.apply_gradients(phase, grads(dqn, batch, metrics=False)[0])


def targets_equal(dqn: DQN) -> bool:
    return all(torch.equal(p, q) for p, q in zip(dqn.online.parameters(),
                                                  dqn.target.parameters()))


def make_batch(rng: np.random.Generator, b: int, obs_shape=(4,), n_actions=2) -> dict:
    """A random loss batch with the documented dtypes."""
    return {
        "obs": rng.standard_normal((b, *obs_shape)).astype(np.float32),
        "action": rng.integers(0, n_actions, size=b).astype(np.int64),
        "reward": rng.standard_normal(b).astype(np.float32),
        "next_obs": rng.standard_normal((b, *obs_shape)).astype(np.float32),
        "discount": (0.99 ** 3 * (rng.random(b) > 0.2)).astype(np.float32),
        "weights": rng.uniform(0.1, 1.0, size=b).astype(np.float32),
    }


def params_equal(a: DQN, b: DQN) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.online.parameters(), b.online.parameters()))


# ---- shapes, dtypes, determinism -------------------------------------------------------------

def test_registry():
    assert ALGOS["dqn"] is DQN
    assert DQN.name == "dqn" and DQN.Config is DQNConfig


def test_one_phase_q():
    dqn = make(hidden=[8])
    assert all(dqn.phases(u) == ("q",) for u in (0, 1, 49, 50, 10**6))
    assert dqn.phase_size("q") == dqn.num_params
    batch = make_batch(np.random.default_rng(0), 4)
    out = np.zeros(dqn.num_params, np.float32)
    for bad in (lambda: dqn.phase_size("critic"),
                lambda: dqn.compute_gradients("critic", batch, out),
                lambda: dqn.apply_gradients("actor", out)):
        with pytest.raises(ValueError, match="one update phase, 'q'"):
            bad()
    assert dqn.updates == 0


def test_spaces_are_checked():
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    DQN.check_env("CartPole-v1", box, gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="^env: dqn needs a Discrete action space"):
        DQN.check_env("Pendulum-v1", box, box)


@pytest.mark.parametrize("obs_shape", [(4,), (2, 3)])
def test_shapes_and_dtypes(obs_shape):
    dqn = make(obs_shape, 3, hidden=[16, 16])
    rng = np.random.default_rng(0)
    batch = make_batch(rng, 8, obs_shape, 3)
    actions = dqn.act(batch["obs"], np.full(8, 0.5), rng)
    assert actions.shape == (8,) and actions.dtype == np.int64
    assert ((actions >= 0) & (actions < 3)).all()

    loss, metrics, prio = dqn.loss(batch)
    assert loss.shape == () and loss.requires_grad
    assert set(metrics) == {"loss", "q_mean", "td_abs_mean"}
    assert all(isinstance(v, float) for v in metrics.values())
    assert prio.shape == (8,) and prio.dtype == np.float64

    grad, metrics, prio = grads(dqn, batch)
    assert grad.shape == (dqn.num_params,) and grad.dtype == np.float32
    assert not np.isnan(grad).any()      # every entry of `out` was written
    assert set(metrics) == set(DQN.metric_names) and "grad_norm" in metrics
    assert all(isinstance(v, float) for v in metrics.values())
    assert prio.shape == (8,) and prio.dtype == np.float64
    assert grads(dqn, batch, metrics=False)[1] == {}
    assert dqn.num_params == sum(p.numel() for p in dqn.online.parameters())
    flat = dqn.get_flat_params()
    assert flat.shape == (dqn.num_params,) and flat.dtype == np.float32
    np.testing.assert_array_equal(dqn.policy_params(), flat)
    assert dqn.policy_params().dtype == np.float32


@pytest.mark.parametrize("bad", ["none", "float64", "short", "2d"])
def test_compute_gradients_needs_a_float32_buffer_of_the_right_size(bad):
    dqn = make(hidden=[8])
    n = dqn.num_params
    out = {"none": None, "float64": np.zeros(n, np.float64), "short": np.zeros(n - 1, np.float32),
           "2d": np.zeros((1, n), np.float32)}[bad]
    with pytest.raises(ValueError, match="out must be float32"):
        dqn.compute_gradients("q", make_batch(np.random.default_rng(0), 4), out)


def test_same_seed_same_params_and_no_global_rng_side_effect():
    state = torch.get_rng_state()
    a, b, c = make(seed=7), make(seed=7), make(seed=8)
    assert torch.equal(torch.get_rng_state(), state)
    assert params_equal(a, b) and a.digest() == b.digest()
    assert not np.array_equal(a.get_flat_params(), c.get_flat_params())
    assert a.digest() != c.digest()
    # The target starts as an exact copy of the online net.
    assert all(torch.equal(p, q) for p, q in zip(a.online.parameters(), a.target.parameters()))


def test_flat_params_round_trip_and_gradient_copy():
    a, b = make(hidden=[8], seed=1), make(hidden=[8], seed=2)
    flat = a.get_flat_params()
    b.set_flat_params(flat)
    assert params_equal(a, b)
    np.testing.assert_array_equal(b.get_flat_params(), flat)
    flat[:] = 0  # a copy: scribbling on it leaves the network alone
    assert a.get_flat_params().any() and params_equal(a, b)

    grad, _, _ = grads(a, make_batch(np.random.default_rng(0), 4))
    grad[:] = 123.0
    assert not any((p.grad == 123.0).any() for p in a.online.parameters())
    with pytest.raises(ValueError):
        a.set_flat_params(np.zeros(a.num_params + 1, np.float32))
    with pytest.raises(ValueError):
        a.apply_gradients("q", np.zeros(a.num_params - 1, np.float32))


# ---- acting ----------------------------------------------------------------------------------

def test_act_greedy_at_epsilon_zero():
    dqn = make((4,), 5, hidden=[32], seed=3)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((256, 4)).astype(np.float32)
    with torch.no_grad():
        expected = dqn.online(torch.from_numpy(obs)).argmax(dim=1).numpy()
    np.testing.assert_array_equal(dqn.act(obs, np.zeros(256), rng), expected)
    np.testing.assert_array_equal(dqn.act(obs, 0.0, rng), expected)  # scalar broadcasts


def test_act_uniform_at_epsilon_one():
    n_actions, n = 4, 8000
    dqn = make((4,), n_actions, hidden=[8])
    obs = np.zeros((n, 4), np.float32)  # one observation: greedy would always pick one action
    counts = np.bincount(dqn.act(obs, np.ones(n), np.random.default_rng(1)), minlength=n_actions)
    expected = n / n_actions
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 16.27, counts  # chi-square, 3 degrees of freedom, p = 0.001


def test_act_per_row_epsilon():
    dqn = make((4,), 4, hidden=[8])
    rng = np.random.default_rng(2)
    obs = np.zeros((4000, 4), np.float32)
    eps = np.where(np.arange(4000) % 2 == 0, 0.0, 1.0)
    actions = dqn.act(obs, eps, rng)
    greedy = dqn.act(obs[:1], np.zeros(1), rng)[0]
    assert (actions[0::2] == greedy).all()
    assert len(np.unique(actions[1::2])) == 4


# ---- the actors' policy ----------------------------------------------------------------------

EPS = dict(eps_start=1.0, eps_final=0.5, exploration_steps=1000, eps_spread=1.0)


def test_actor_epsilon_decays_to_each_actors_final_epsilon():
    cfg = DQNConfig(**EPS)
    assert actor_epsilon(cfg, 0, 2, 0) == 1.0
    assert actor_epsilon(cfg, 0, 2, 500) == pytest.approx(0.75)
    assert actor_epsilon(cfg, 0, 2, 1000) == pytest.approx(0.5)
    assert actor_epsilon(cfg, 0, 2, 10**9) == pytest.approx(0.5)
    # Actor N-1 of N ends at eps_final ** (1 + eps_spread): 0.25.
    assert actor_epsilon(cfg, 1, 2, 1000) == pytest.approx(0.25)
    assert actor_epsilon(cfg, 1, 2, 500) == pytest.approx(0.625)
    assert actor_epsilon(cfg, 2, 5, 10**9) == pytest.approx(0.5 ** 1.5)
    assert actor_epsilon(cfg, 0, 1, 10**9) == pytest.approx(0.5)       # one actor: no spread
    flat = DQNConfig(**{**EPS, "eps_spread": 0.0})
    assert actor_epsilon(flat, 3, 4, 10**9) == pytest.approx(0.5)
    instant = DQNConfig(**{**EPS, "exploration_steps": 0})
    assert actor_epsilon(instant, 0, 2, 0) == pytest.approx(0.5)


def explore_rate(policy: QPolicy, global_steps: float, n: int = 20_000) -> float:
    """Fraction of actions that are not the greedy one, on a single observation."""
    obs = np.zeros((n, 4), np.float32)
    rng = np.random.default_rng(11)
    greedy = policy.act(obs[:1], rng, global_steps, deterministic=True)[0]
    return float((policy.act(obs, rng, global_steps) != greedy).mean())


@pytest.mark.parametrize("actor, global_steps", [(0, 0), (0, 500), (0, 5000), (1, 500),
                                                 (1, 5000)])
def test_policy_explores_with_its_actors_epsilon(actor, global_steps):
    dqn = make((4,), 4, hidden=[8], **EPS)
    policy = dqn.make_policy(actor, 2)
    assert isinstance(policy, QPolicy)
    eps = actor_epsilon(dqn.config, actor, 2, global_steps)
    # A random action is the greedy one 1 time in 4.
    assert explore_rate(policy, global_steps) == pytest.approx(eps * 3 / 4, abs=0.02)


@pytest.mark.parametrize("fields", [{"hidden": [32]}, {"hidden": [16, 8], "dueling": True},
                                    {"hidden": []}])
def test_mlp_policies_act_through_numpy_as_through_torch(fields):
    """An MLP policy is numpy's (QPolicy, what an actor rank without torch runs): its
    Q-values are the torch network's to float32 rounding, also after new weights
    arrive, and its actions (greedy and epsilon-greedy, the same generator state) are
    torch's path's."""
    dqn = make((3,), 4, seed=5, **fields)
    policy = dqn.make_policy(0, 1)
    assert isinstance(policy, QPolicy)
    rng = np.random.default_rng(2)
    obs = rng.standard_normal((64, 3)).astype(np.float32)
    for seed in (5, 6):
        net = make((3,), 4, seed=seed, **fields).online
        with torch.no_grad():
            want = net(torch.from_numpy(obs)).numpy()
        np.testing.assert_allclose(policy.q(obs), want, rtol=1e-5, atol=1e-6)
        g1, g2 = np.random.default_rng(9), np.random.default_rng(9)
        steps = dqn.config.exploration_steps // 2            # a mix of greedy and random
        eps = actor_epsilon(dqn.config, 0, 1, steps)
        assert 0.2 < eps < 0.8
        got = policy.act(obs, g1, steps)
        np.testing.assert_array_equal(got, epsilon_greedy(net, torch.from_numpy(obs), eps,
                                                          4, g2))
        assert g1.random() == g2.random()                # the same draws, no more
        policy.set_flat_params(make((3,), 4, seed=6, **fields).policy_params())


def test_the_spec_builds_the_policy_without_torch_and_frames_get_none():
    """`DQNSpec.numpy_policy`, what an actor rank that is no learner builds (it imports
    no torch): the learner's layout of the parameters, zeros until the first ones are
    published; frames (a CNN torso) have none and act through torch (DQNPolicy)."""
    dqn = make((5,), 3, hidden=[7, 6], dueling=True, seed=1)
    box = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
    policy = DQNSpec.numpy_policy(box, gym.spaces.Discrete(3), dqn.config, 0, 1)
    assert policy.num_params == dqn.num_params
    policy.set_flat_params(dqn.policy_params())
    obs = np.random.default_rng(3).standard_normal((32, 5)).astype(np.float32)
    with torch.no_grad():
        np.testing.assert_allclose(policy.q(obs), dqn.online(torch.from_numpy(obs)).numpy(),
                                   rtol=1e-5, atol=1e-6)
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert DQNSpec.numpy_policy(frames, gym.spaces.Discrete(3), dqn.config, 0, 1) is None
    image = DQN(frames, gym.spaces.Discrete(3), DQNConfig(), seed=0)
    assert isinstance(image.make_policy(0, 1), DQNPolicy)


@pytest.mark.parametrize("dueling", [False, True])
def test_minatar_policy_acts_in_numpy_as_the_torch_network(dueling):
    """MinAtar's network (conv 16 3x3, dense 128) acts in numpy too (MinAtarQValues, the
    convolution in C from the uint8 frames): torch's Q-values to float32 rounding, on
    0/1 frames as MinAtar's and on other bytes, after each new set of parameters."""
    frames = gym.spaces.Box(0, 1, (4, 10, 10), np.uint8)
    cfg = DQNConfig(cnn="minatar", dueling=dueling)
    policy = DQN(frames, gym.spaces.Discrete(6), cfg, seed=0).make_policy(1, 3)
    assert isinstance(policy, QPolicy)
    rng = np.random.default_rng(4)
    for seed in (1, 2):
        net = DQN(frames, gym.spaces.Discrete(6), cfg, seed=seed)
        policy.set_flat_params(net.policy_params())
        for obs in (rng.random((16, 4, 10, 10)) < 0.3, rng.integers(0, 256, (5, 4, 10, 10))):
            obs = obs.astype(np.uint8)
            with torch.no_grad():
                want = net.online(torch.from_numpy(obs)).numpy()
            np.testing.assert_allclose(policy.q(obs), want, rtol=1e-4, atol=1e-5)
            np.testing.assert_array_equal(
                policy.act(obs, rng, 0, deterministic=True), want.argmax(axis=1))


def test_policy_deterministic_is_greedy():
    dqn = make((4,), 5, hidden=[32], seed=3, eps_final=1.0)   # epsilon 1 throughout
    policy = dqn.make_policy(0, 1)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((256, 4)).astype(np.float32)
    with torch.no_grad():
        expected = dqn.online(torch.from_numpy(obs)).argmax(dim=1).numpy()
    actions = policy.act(obs, rng, 0, deterministic=True)
    assert actions.dtype == np.int64 and actions.shape == (256,)
    np.testing.assert_array_equal(actions, expected)
    assert (policy.act(obs, rng, 0) != expected).mean() > 0.5    # and not greedy otherwise


def test_policy_loads_published_params():
    a, b = make(hidden=[16], seed=1), make(hidden=[16], seed=2)
    policy = b.make_policy(0, 1)
    assert policy.num_params == a.num_params == len(a.policy_params())
    obs = np.random.default_rng(0).standard_normal((512, 4)).astype(np.float32)
    greedy = lambda: policy.act(obs, np.random.default_rng(0), 0, deterministic=True)  # noqa: E731
    before = greedy()
    published = a.policy_params()
    policy.set_flat_params(published)
    published[:] = 0.0                   # a copy: the policy does not alias the vector
    np.testing.assert_array_equal(greedy(), a.act(obs, 0.0, np.random.default_rng(0)))
    assert not np.array_equal(before, greedy())
    np.testing.assert_array_equal(policy.q.flat, a.policy_params())
    # The learner's own network is not the policy's.
    assert not np.array_equal(b.policy_params(), a.policy_params())
    with pytest.raises(ValueError):
        policy.set_flat_params(np.zeros(policy.num_params + 1, np.float32))


# ---- the loss against a hand computation -----------------------------------------------------

def linear_dqn(double_q: bool) -> DQN:
    """No hidden layers: Q(s) = W s + b, with online and target weights set by hand."""
    dqn = make((2,), 3, hidden=[], double_q=double_q)
    with torch.no_grad():
        dqn.online.head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]))
        dqn.online.head.bias.copy_(torch.tensor([0.0, 0.1, -0.2]))
        dqn.target.head.weight.copy_(torch.tensor([[2.0, -1.0], [0.5, 1.5], [-1.0, 1.0]]))
        dqn.target.head.bias.copy_(torch.tensor([0.3, 1.0, 0.1]))
    return dqn


HAND_BATCH = {
    "obs": np.array([[1.0, 2.0], [0.5, -1.0], [3.0, 0.0]], np.float32),
    "action": np.array([0, 2, 1], np.int64),
    "reward": np.array([1.0, -0.5, 2.0], np.float32),
    "next_obs": np.array([[2.0, 1.0], [0.0, 1.0], [1.0, 1.0]], np.float32),
    "discount": np.array([0.9, 0.0, 0.81], np.float32),
    "weights": np.array([1.0, 0.5, 0.25], np.float32),
}


def hand_loss(double_q: bool):
    """The same loss in float64 numpy, written out long-hand."""
    w_on = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]); b_on = np.array([0.0, 0.1, -0.2])
    w_tg = np.array([[2.0, -1.0], [0.5, 1.5], [-1.0, 1.0]]); b_tg = np.array([0.3, 1.0, 0.1])
    b = {k: v.astype(np.float64) for k, v in HAND_BATCH.items()}
    q_all = b["obs"] @ w_on.T + b_on
    q = q_all[np.arange(3), HAND_BATCH["action"]]
    next_online = b["next_obs"] @ w_on.T + b_on
    next_target = b["next_obs"] @ w_tg.T + b_tg
    if double_q:
        next_v = next_target[np.arange(3), next_online.argmax(axis=1)]
    else:
        next_v = next_target.max(axis=1)
    td = b["reward"] + b["discount"] * next_v - q
    huber = np.where(np.abs(td) < 1.0, 0.5 * td ** 2, np.abs(td) - 0.5)
    return (b["weights"] * huber).mean(), np.abs(td), q_all.mean()


@pytest.mark.parametrize("double_q", [True, False])
def test_loss_matches_hand_computation(double_q):
    dqn = linear_dqn(double_q)
    loss, metrics, prio = dqn.loss(HAND_BATCH)
    exp_loss, exp_td_abs, exp_q_mean = hand_loss(double_q)
    np.testing.assert_allclose(loss.item(), exp_loss, rtol=1e-6)
    np.testing.assert_allclose(metrics["loss"], exp_loss, rtol=1e-6)
    np.testing.assert_allclose(prio, exp_td_abs, rtol=1e-6)
    np.testing.assert_allclose(metrics["td_abs_mean"], exp_td_abs.mean(), rtol=1e-6)
    np.testing.assert_allclose(metrics["q_mean"], exp_q_mean, rtol=1e-6)
    # The batch covers both Huber branches and a terminal row.
    assert (exp_td_abs < 1).any() and (exp_td_abs > 1).any()


def test_double_and_max_targets_differ_on_hand_batch():
    # Row 0: the online net prefers action 0 at next_obs, the target net action 1.
    assert hand_loss(True)[0] != pytest.approx(hand_loss(False)[0])


def test_importance_weights_scale_the_loss():
    dqn = linear_dqn(True)
    base = dqn.loss({**HAND_BATCH, "weights": np.ones(3, np.float32)})[0].item()
    doubled = dqn.loss({**HAND_BATCH, "weights": np.full(3, 2.0, np.float32)})[0].item()
    assert doubled == pytest.approx(2 * base, rel=1e-6)
    only_first = dqn.loss({**HAND_BATCH, "weights": np.array([1.0, 0, 0], np.float32)})
    _, td_abs, _ = hand_loss(True)
    huber0 = 0.5 * td_abs[0] ** 2 if td_abs[0] < 1 else td_abs[0] - 0.5
    assert only_first[0].item() == pytest.approx(huber0 / 3, rel=1e-6)
    # Priorities are the TD errors themselves, not weighted.
    np.testing.assert_allclose(only_first[2], td_abs, rtol=1e-6)


# ---- the split gradient step -----------------------------------------------------------------

@pytest.mark.parametrize("grad_clip", [0.05, 0.0])
@pytest.mark.parametrize("dueling", [False, True])
def test_split_step_equals_textbook_step(grad_clip, dueling):
    """compute_gradients + apply_gradients (flat buffer, one fused Adam) against the
    textbook step: a separate copy of the network, loss.backward(), clip_grad_norm_
    and a per-tensor torch Adam."""
    dqn = make((4,), 3, hidden=[16, 16], dueling=dueling, grad_clip=grad_clip, seed=4, lr=1e-2)
    plain = copy.deepcopy(dqn)   # for its loss(); its own parameters are rebuilt below
    plain.online = copy.deepcopy(dqn.online)
    plain_params = list(plain.online.parameters())
    for p in plain_params:
        p.grad = None
    plain_opt = torch.optim.Adam(plain_params, lr=1e-2, foreach=False, fused=False)
    rng = np.random.default_rng(5)
    for _ in range(5):
        batch = make_batch(rng, 32, (4,), 3)
        grad, metrics, prio = grads(dqn, batch)
        dqn.apply_gradients("q", grad)

        plain_opt.zero_grad()
        loss, _, plain_prio = plain.loss(batch)
        loss.backward()
        if grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(plain_params, grad_clip)
            assert metrics["grad_norm"] == pytest.approx(norm.item(), rel=1e-5)
            assert metrics["grad_norm"] > grad_clip  # clipping was exercised
        plain_opt.step()
        np.testing.assert_allclose(prio, plain_prio, rtol=1e-4, atol=1e-6)
        for p, q in zip(dqn.online.parameters(), plain_params):
            np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-4, atol=1e-6)
    # The step moved the parameters (so the comparison above compared something).
    assert not params_equal(dqn, make((4,), 3, hidden=[16, 16], dueling=dueling, seed=4))


def test_parameters_and_gradients_are_views_of_one_buffer():
    dqn = make(hidden=[8], seed=1)
    grad, _, _ = grads(dqn, make_batch(np.random.default_rng(0), 16))
    assert np.abs(grad).sum() > 0
    # The per-tensor .grad views hold exactly the returned flat gradient.
    np.testing.assert_array_equal(
        np.concatenate([p.grad.reshape(-1).numpy() for p in dqn.online.parameters()]), grad)
    # Writing the flat vector moves the module's parameters.
    dqn.set_flat_params(np.arange(dqn.num_params, dtype=np.float32))
    first = next(dqn.online.parameters())
    assert first.reshape(-1)[3].item() == 3.0
    np.testing.assert_array_equal(dqn.get_flat_params(), np.arange(dqn.num_params, dtype=np.float32))


def test_learners_applying_the_same_average_stay_identical():
    a, b = make(hidden=[16], seed=9, target_update=2), make(hidden=[16], seed=9, target_update=2)
    rng = np.random.default_rng(6)
    for _ in range(5):
        ga, _, _ = grads(a, make_batch(rng, 16))
        gb, _, _ = grads(b, make_batch(rng, 16))  # different data per learner
        assert not np.array_equal(ga, gb)
        total = ga + gb       # what an Allreduce(SUM) hands back; scale makes it the mean
        a.apply_gradients("q", total, scale=0.5)
        b.apply_gradients("q", total, scale=0.5)
    assert params_equal(a, b) and a.digest() == b.digest()
    assert all(torch.equal(p, q) for p, q in zip(a.target.parameters(), b.target.parameters()))


def test_scale_turns_the_sum_into_the_mean():
    # A gradient far below Adam's epsilon (1e-8), so the step is proportional to it and
    # a wrong scale shows (Adam is otherwise all but blind to a gradient's scale).
    grad = grads(make(hidden=[16], seed=9), make_batch(np.random.default_rng(6), 16))[0] * 1e-12
    summed, single, unscaled = (make(hidden=[16], seed=9, grad_clip=0.0) for _ in range(3))
    summed.apply_gradients("q", 2 * grad, scale=0.5)
    single.apply_gradients("q", grad)
    unscaled.apply_gradients("q", 2 * grad)
    assert params_equal(summed, single)
    assert not params_equal(unscaled, single)


def test_sync_target_and_state_dict_round_trip():
    dqn = make(hidden=[16], seed=0, target_update=3)
    rng = np.random.default_rng(7)
    step(dqn, make_batch(rng, 16))
    assert not targets_equal(dqn)
    state = dqn.state_dict()
    assert state["updates"] == 1
    other = make(hidden=[16], seed=1, target_update=3)
    other.load_state_dict(copy.deepcopy(state))
    assert params_equal(dqn, other) and other.updates == 1
    assert all(torch.equal(p, q) for p, q in zip(dqn.target.parameters(), other.target.parameters()))
    # Optimizer moments and the update count were restored too: the next steps match
    # exactly, the target sync at update 3 included.
    for _ in range(2):
        batch = make_batch(rng, 16)
        step(dqn, batch)
        step(other, batch)
        assert params_equal(dqn, other)
    assert dqn.updates == other.updates == 3
    assert targets_equal(dqn) and targets_equal(other)

    step(dqn, make_batch(rng, 16))
    assert not targets_equal(dqn)
    dqn.sync_target()
    assert targets_equal(dqn)


@pytest.mark.parametrize("target_update", [1, 3, 4])
def test_target_syncs_every_target_update_applies(target_update):
    dqn = make(hidden=[8], seed=0, target_update=target_update)
    rng = np.random.default_rng(3)
    synced_at = []
    for u in range(1, 13):
        before = [p.clone() for p in dqn.target.parameters()]
        step(dqn, make_batch(rng, 8))
        assert dqn.updates == u
        moved = not all(torch.equal(p, q) for p, q in zip(before, dqn.target.parameters()))
        if moved:
            assert targets_equal(dqn)      # a sync copies the online net exactly
            synced_at.append(u)
    assert synced_at == list(range(target_update, 13, target_update))
    # compute_gradients alone neither counts an update nor syncs.
    grads(dqn, make_batch(rng, 8))
    assert dqn.updates == 12


def test_dueling_head_combines_value_and_centred_advantage():
    net = QNetwork(4, 3, hidden=(8,), dueling=True)
    x = torch.randn(5, 4)
    z = net.trunk(x)
    adv = net.advantage(z)
    expected = net.value(z) + adv - adv.mean(dim=1, keepdim=True)
    torch.testing.assert_close(net(x), expected)
    # Centred advantages: the mean Q over actions is the value.
    torch.testing.assert_close(net(x).mean(dim=1, keepdim=True), net.value(z))


# ---- learning --------------------------------------------------------------------------------

def nstep_transitions(pending: deque, next_obs, terminated: bool, gamma: float, flush: bool):
    """Yield (obs, action, n-step return, next_obs, discount) for the oldest pending
    step, or for all of them when the episode ended (`flush`)."""
    while pending and (flush or len(pending) == pending.maxlen):
        ret = sum(gamma ** i * r for i, (_, _, r) in enumerate(pending))
        discount = 0.0 if terminated else gamma ** len(pending)
        obs, action, _ = pending.popleft()
        yield obs, action, ret, next_obs, discount


def greedy_return(dqn: DQN, env, seed: int) -> float:
    """One episode of the actors' policy, loaded from the learner's published params."""
    policy = dqn.make_policy(0, 1)
    policy.set_flat_params(dqn.policy_params())
    obs, _ = env.reset(seed=seed)
    total, done = 0.0, False
    rng = np.random.default_rng(0)
    while not done:
        action = policy.act(obs[None].astype(np.float32), rng, 0, deterministic=True)[0]
        obs, r, terminated, truncated, _ = env.step(int(action))
        total += r
        done = terminated or truncated
    return total


def train_cartpole(seed: int = 0, steps: int = 15_000, train_every: int = 2, batch_size: int = 64,
                   lr: float = 1e-3, target_update: int = 125) -> list[float]:
    """n-step double DQN on CartPole-v1 with a uniform numpy ring buffer; returns the
    undiscounted returns of 5 greedy evaluation episodes."""
    env = gym.make("CartPole-v1")
    gamma, n_step, cap = 0.99, 3, 20_000
    dqn = DQN(env.observation_space, env.action_space,
              DQNConfig(hidden=[64, 64], lr=lr, target_update=target_update), seed=seed)
    rng = np.random.default_rng(seed)
    buf = {"obs": np.zeros((cap, 4), np.float32), "action": np.zeros(cap, np.int64),
           "reward": np.zeros(cap, np.float32), "next_obs": np.zeros((cap, 4), np.float32),
           "discount": np.zeros(cap, np.float32)}
    size = head = 0
    pending: deque = deque(maxlen=n_step)
    obs, _ = env.reset(seed=seed)
    for t in range(steps):
        eps = max(0.05, 1.0 - t / (steps / 3))
        action = int(dqn.act(obs[None].astype(np.float32), np.array([eps]), rng)[0])
        next_obs, r, terminated, truncated, _ = env.step(action)
        pending.append((obs, action, r))
        done = terminated or truncated
        for tr in nstep_transitions(pending, next_obs, terminated, gamma, flush=done):
            for key, value in zip(buf, tr):
                buf[key][head] = value
            head, size = (head + 1) % cap, min(size + 1, cap)
        obs = env.reset()[0] if done else next_obs

        if t >= 1000 and t % train_every == 0:
            idx = rng.integers(0, size, size=batch_size)
            batch = {k: v[idx] for k, v in buf.items()}
            batch["weights"] = np.ones(batch_size, np.float32)
            step(dqn, batch)
    return [greedy_return(dqn, env, seed=1000 + seed * 10 + i) for i in range(5)]


@pytest.mark.slow
def test_learns_cartpole():
    """~15k CartPole steps lift the greedy return well above a random policy's (~22).

    Deterministic for a given machine (seed 0 scores ~320 here, ~15 s on one thread);
    over seeds 0-9 all clear 180 (184-340), so the margin is real but a different BLAS
    could land on a weaker run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        returns = train_cartpole(seed=0)
    finally:
        torch.set_num_threads(threads)
    assert np.mean(returns) > 150, returns


def test_atari_ids_get_the_published_settings_and_flags_win():
    from pal_hpc.config_io import load_config
    cfg = load_config(["--algo", "dqn", "--env", "ALE/Pong-v5"])
    acfg = cfg.algo_config
    assert (cfg.total_steps, cfg.n_step, cfg.batch_size, cfg.learning_starts, cfg.replay_ratio,
            cfg.per_alpha, cfg.per_weights, cfg.reward_clip, cfg.replay_capacity) == (
        1_000_000, 3, 32, 20_000, 8.0, 0.5, "batch", True, 0)
    assert (acfg.lr, acfg.adam_eps, acfg.target_update, acfg.cnn, acfg.dueling, acfg.double_q,
            acfg.exploration_steps, acfg.eps_final) == (
        6.25e-5, 1.5e-4, 2_000, "nature", True, True, 250_000, 0.01)
    given = load_config(["--algo", "dqn", "--env", "ALE/Pong-v5", "--total-steps", "5000",
                         "--lr", "1e-4", "--n-step", "1"])
    assert (given.total_steps, given.algo_config.lr, given.n_step) == (5000, 1e-4, 1)
    plain = load_config(["--algo", "dqn", "--env", "CartPole-v1"])
    assert plain.total_steps == 100_000 and plain.algo_config.adam_eps == 1e-8


# ---- the numpy gradient path (dqn_numpy.NumpyTD) ---------------------------------------------


def frame_dqn(shape=(4, 10, 10), n_actions=3, **fields) -> DQN:
    obs_space = gym.spaces.Box(0, 255, shape, np.uint8)
    return DQN(obs_space, gym.spaces.Discrete(n_actions),
               DQNConfig(cnn="minatar", **fields), seed=3)


def frame_batch(rng: np.random.Generator, b: int, shape, n_actions: int) -> dict:
    """MinAtar-like frames: a few cells of each channel at 255, the rest 0."""
    frames = lambda: ((rng.random((b, *shape)) < 0.1) * 255).astype(np.uint8)  # noqa: E731
    batch = make_batch(rng, b, (1,), n_actions)
    batch.update(obs=frames(), next_obs=frames())
    return batch


@pytest.mark.parametrize("net, fields", [
    ("mlp", {}),
    ("mlp", {"dueling": True, "double_q": True, "loss": "mse", "hidden": [32, 16, 8]}),
    ("minatar", {"double_q": False, "optimizer": "rmsprop"}),
    ("minatar", {"dueling": True, "double_q": True}),
])
def test_numpy_td_gradient_is_autograds(net, fields):
    """Small networks on the CPU take their TD gradient through numpy: the gradient,
    the priorities and the metrics are autograd's (DQN.loss and backward) to float32
    rounding -- over several updates (the target network synced in between) and TD
    errors on both sides of the Huber loss's kink -- and a network it does not fit
    stays on autograd."""
    rng = np.random.default_rng(11)
    if net == "mlp":
        dqn, shape, n_actions = make((2, 3), 4, seed=2, target_update=2, **fields), (2, 3), 4
        batch_of = lambda: make_batch(rng, 48, shape, n_actions)  # noqa: E731
    else:
        shape, n_actions = (5, 10, 10), 6
        dqn = frame_dqn(shape, n_actions, target_update=2, **fields)
        batch_of = lambda: frame_batch(rng, 32, shape, n_actions)  # noqa: E731
    assert dqn._np_td is not None
    for update in range(4):
        batch = batch_of()
        batch["reward"] *= 3.0                      # TD errors beyond 1 as well as within
        got, stats, prio = grads(dqn, batch)
        np_td, dqn._np_td = dqn._np_td, None
        want, want_stats, want_prio = grads(dqn, batch)
        dqn._np_td = np_td
        scale = np.abs(want).max()
        assert scale > 0 and np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)
        np.testing.assert_allclose(prio, want_prio, rtol=1e-4, atol=1e-5)
        assert prio.dtype == np.float64 and (prio > 1).any() and (prio < 1).any()
        assert stats.keys() == want_stats.keys()
        for key in want_stats:
            assert stats[key] == pytest.approx(want_stats[key], rel=1e-4, abs=1e-6), key
        dqn.apply_gradients("q", got)
    assert not targets_equal(dqn) or dqn.updates % 2 == 0
    # Frames of the Atari torsos, and bf16, stay on autograd.
    nips = DQN(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(3),
                 DQNConfig(cnn="nips"), seed=0)
    assert nips._np_td is None
    assert make((4,), 2, precision="bf16")._np_td is None
