"""DDPG maths (and what TD3 inherits from it): shapes, acting and exploration, the phase
schedule, the critic loss and Polyak averaging against hand computation, the actor
phase's gradient, determinism across learners, checkpoints and config validation."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from pal_hpc.algos.acting import actor_sigma
from pal_hpc.algos.ddpg import DDPG, DDPGConfig
from pal_hpc.algos.td3 import TD3
from algo_checks import mlp_np, update
from pal_hpc.config import ConfigError

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def make_batch(rng: np.random.Generator, b: int, obs_dim: int = 3, act_dim: int = 2) -> dict:
    """A random loss batch with the documented dtypes."""
    return {
        "obs": rng.standard_normal((b, obs_dim)).astype(np.float32),
        "action": rng.uniform(-1, 1, (b, act_dim)).astype(np.float32),
        "reward": rng.standard_normal(b).astype(np.float32),
        "next_obs": rng.standard_normal((b, obs_dim)).astype(np.float32),
        "discount": (0.98 * (rng.random(b) > 0.2)).astype(np.float32),
        "weights": rng.uniform(0.1, 1.0, b).astype(np.float32),
    }


def small(cls=DDPG, seed=0, **kw):
    return cls(OBS, ACT, cls.Config(hidden=[8, 8], **kw), seed=seed)


# ---- shapes, acting, exploration ---------------------------------------------------------

@pytest.mark.parametrize("cls", [DDPG, TD3])
def test_shapes_and_dtypes(cls):
    algo = small(cls)
    batch = make_batch(np.random.default_rng(0), 16)
    assert algo.phase_size("critic") == sum(p.numel() for p in algo.critics.parameters())
    assert algo.phase_size("actor") == sum(p.numel() for p in algo.actor.parameters())
    assert len(algo.critics) == (2 if cls is TD3 else 1)

    out = np.zeros(algo.phase_size("critic"), np.float32)
    metrics, prio = algo.compute_gradients("critic", batch, out, metrics=True)
    assert set(metrics) == {"critic_loss", "q_mean", "td_abs_mean"} <= set(algo.metric_names)
    assert all(isinstance(v, float) for v in metrics.values())
    assert prio.shape == (16,) and prio.dtype == np.float64 and (prio >= 0).all()
    assert out.any()
    out = np.zeros(algo.phase_size("actor"), np.float32)
    metrics, prio = algo.compute_gradients("actor", batch, out, metrics=True)
    assert set(metrics) == {"actor_loss"} and prio is None and out.any()
    assert algo.compute_gradients("actor", batch, out) == ({}, None)
    with pytest.raises(ValueError, match="float32"):
        algo.compute_gradients("critic", batch, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="phases"):
        algo.phase_size("q")

    policy = algo.make_policy(0, 1)
    flat = algo.policy_params()
    assert flat.dtype == np.float32 and flat.shape == (policy.num_params,)
    for steps in (0, 1e9):
        actions = policy.act(batch["obs"], np.random.default_rng(1), steps)
        assert actions.shape == (16, 2) and actions.dtype == np.float32
    with pytest.raises(ValueError, match="entries"):
        policy.set_flat_params(flat[:-1])


@pytest.mark.parametrize("cls", [DDPG, TD3])
def test_check_env_needs_box(cls):
    cls.check_env("Pendulum-v1", OBS, ACT)
    with pytest.raises(ConfigError, match=r"^env: .*Box"):
        cls.check_env("CartPole-v1", OBS, gym.spaces.Discrete(2))


def test_actions_stay_in_range():
    algo = small(action_noise=3.0, random_steps=0)
    policy = algo.make_policy(0, 1)
    obs = 100 * np.random.default_rng(0).standard_normal((2000, 3)).astype(np.float32)
    for deterministic in (False, True):
        actions = policy.act(obs, np.random.default_rng(1), 0, deterministic)
        assert (np.abs(actions) <= 1).all()
    assert (np.abs(policy.act(obs, np.random.default_rng(1), 0)) == 1).mean() > 0.3  # clipped


def test_random_phase_then_per_actor_noise_spread():
    cfg = DDPGConfig(hidden=[8, 8], action_noise=0.1, noise_spread=1.0, random_steps=500)
    algo = DDPG(OBS, ACT, cfg)
    obs = np.zeros((20_000, 3), np.float32)    # one state: the mean action is a constant
    rng = np.random.default_rng(0)
    assert [actor_sigma(cfg, i, 4) for i in range(4)] == pytest.approx([0.1, 0.4 / 3, 0.5 / 3, 0.2])
    assert actor_sigma(cfg, 0, 1) == 0.1

    uniform = algo.make_policy(3, 4).act(obs, rng, global_steps=499)
    assert uniform.min() >= -1 and uniform.max() <= 1
    assert uniform.std() == pytest.approx(1 / np.sqrt(3), rel=0.02)   # U(-1, 1), not noise
    assert uniform.mean() == pytest.approx(0.0, abs=0.02)

    for i in range(4):
        policy = algo.make_policy(i, 4)
        mean = policy.act(obs[:1], rng, 500, deterministic=True)
        assert np.abs(mean).max() < 0.5    # far from the clip: noise std is measurable
        noise = policy.act(obs, rng, global_steps=500) - mean
        np.testing.assert_allclose(noise.std(axis=0), [actor_sigma(cfg, i, 4)] * 2, rtol=0.03)
        np.testing.assert_allclose(noise.mean(axis=0), 0.0, atol=0.01)


@pytest.mark.parametrize("steps", [0, 1e6])
def test_deterministic_act_is_the_actor_output(steps):
    algo, other = small(seed=1), small(seed=2)
    policy = other.make_policy(0, 2)
    policy.set_flat_params(algo.policy_params())     # the learners' published vector
    obs = np.random.default_rng(0).standard_normal((32, 3)).astype(np.float32)
    with torch.no_grad():
        expected = algo.actor(torch.as_tensor(obs)).numpy()
    # The policy is numpy's (acting.DeterministicPolicy): torch's to float32 rounding.
    np.testing.assert_allclose(policy.act(obs, np.random.default_rng(0), steps, True), expected,
                               rtol=1e-5, atol=1e-6)
    assert not np.array_equal(policy.act(obs, np.random.default_rng(0), steps), expected)


def test_phases_every_update():
    algo = small()
    assert [algo.phases(u) for u in range(4)] == [("critic", "actor")] * 4


# ---- the maths against hand computation ---------------------------------------------------

def test_critic_loss_and_priorities_by_hand():
    algo = small(seed=3)
    batch = make_batch(np.random.default_rng(4), 6)
    # Move the online critic away from its target so that the two differ.
    update(algo, 0, make_batch(np.random.default_rng(5), 6))
    loss, stats, prio = algo.critic_loss(batch)

    def q(net, obs, act):
        return mlp_np(net.mlp, np.concatenate([obs, act], axis=1).astype(np.float64))[:, 0]

    next_a = np.tanh(mlp_np(algo.actor_target.mlp, batch["next_obs"].astype(np.float64)))
    next_q = q(algo.critic_target[0], batch["next_obs"], next_a)
    target = batch["reward"] + batch["discount"] * next_q
    td = target - q(algo.critics[0], batch["obs"], batch["action"])
    expected = np.mean(batch["weights"] * td ** 2)         # weighted squared TD error
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert stats["critic_loss"] == pytest.approx(expected, rel=1e-5)
    np.testing.assert_allclose(prio, np.abs(td), rtol=1e-5, atol=1e-6)


def test_actor_gradient_leaves_critic_grads_and_ignores_weights():
    algo = small(seed=6)
    batch = make_batch(np.random.default_rng(7), 10)
    critic_out = np.zeros(algo.phase_size("critic"), np.float32)
    algo.compute_gradients("critic", batch, critic_out)
    critic_grad = algo._critic_params.grad.clone()
    actor_out = np.zeros(algo.phase_size("actor"), np.float32)
    algo.compute_gradients("actor", batch, actor_out)
    assert torch.equal(algo._critic_params.grad, critic_grad)

    obs = torch.as_tensor(batch["obs"])
    grads = torch.autograd.grad(-algo.critics[0](obs, algo.actor(obs)).mean(),
                                list(algo.actor.parameters()))
    np.testing.assert_allclose(actor_out, torch.cat([g.reshape(-1) for g in grads]).numpy(),
                               rtol=1e-6, atol=1e-8)
    again = np.zeros_like(actor_out)
    algo.compute_gradients("actor", {**batch, "weights": 0 * batch["weights"]}, again)
    np.testing.assert_array_equal(again, actor_out)


@pytest.mark.parametrize("cls", [DDPG, TD3])
def test_polyak_after_the_actor_step_by_hand(cls):
    algo = small(cls, tau=0.3)
    batch = make_batch(np.random.default_rng(8), 8)
    for u in range(3):                   # targets and online nets now differ
        update(algo, u, batch)
    for phase, moves in (("critic", False), ("actor", True)):
        before = [a.astype(np.float64) for a in algo.state_arrays()]
        out = np.zeros(algo.phase_size(phase), np.float32)
        algo.compute_gradients(phase, batch, out)
        algo.apply_gradients(phase, out)
        actor, critic, actor_t, critic_t = algo.state_arrays()
        if not moves:   # a critic step leaves the targets alone
            np.testing.assert_array_equal(actor_t, before[2])
            np.testing.assert_array_equal(critic_t, before[3])
            continue
        np.testing.assert_allclose(actor_t, 0.7 * before[2] + 0.3 * actor, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(critic_t, 0.7 * before[3] + 0.3 * critic, rtol=1e-6, atol=1e-7)
        assert not np.array_equal(actor_t, before[2])


def test_gradient_scale_and_clip():
    a, b = small(seed=9), small(seed=9)
    grad = np.random.default_rng(0).standard_normal(a.phase_size("critic")).astype(np.float32)
    a.apply_gradients("critic", grad, scale=0.5)
    b.apply_gradients("critic", 0.5 * grad)
    assert a.digest() == b.digest()
    c = small(seed=9, grad_clip=1e-3)
    c.apply_gradients("critic", grad)
    # Adam's first step is +-lr per coordinate whatever the scale; the clip shows in
    # the first moment.
    first_moment = torch.linalg.vector_norm(c.critic_optimizer.exp_avg).item()
    assert first_moment == pytest.approx(1e-4, rel=1e-3)


# ---- determinism, checkpoints --------------------------------------------------------------

def test_same_seed_same_state_and_no_global_rng_side_effect():
    state = torch.get_rng_state()
    a, b, c = small(seed=7), small(seed=7), small(seed=8)
    assert torch.equal(torch.get_rng_state(), state)
    assert a.digest() == b.digest() != c.digest()
    actor, critic, actor_t, critic_t = a.state_arrays()
    np.testing.assert_array_equal(actor, actor_t)       # targets start as copies
    np.testing.assert_array_equal(critic, critic_t)


def test_learners_applying_averaged_gradients_stay_identical():
    learners = [small(seed=11), small(seed=11)]
    rng = np.random.default_rng(0)
    for u in range(5):
        batches = [make_batch(rng, 16) for _ in learners]   # each samples its own batch
        for phase in learners[0].phases(u):
            outs = [np.zeros(algo.phase_size(phase), np.float32) for algo in learners]
            for algo, batch, out in zip(learners, batches, outs):
                algo.compute_gradients(phase, batch, out)
            total = outs[0] + outs[1]                       # what the Allreduce returns
            for algo in learners:
                algo.apply_gradients(phase, total, scale=0.5)
        assert learners[0].digest() == learners[1].digest()
    assert learners[0].digest() != small(seed=11).digest()


def test_state_dict_round_trip():
    a = small(seed=12)
    batch = make_batch(np.random.default_rng(1), 8)
    for u in range(3):
        update(a, u, batch)
    state = a.state_dict()
    b = small(seed=13)
    b.load_state_dict(state)
    assert a.digest() == b.digest() and (b.updates, b.actor_updates) == (3, 3)
    update(a, 3, batch)
    update(b, 3, batch)
    assert a.digest() == b.digest()
    # The saved state is a copy: the updates since did not change it.
    c = small(seed=14)
    c.load_state_dict(state)
    assert c.digest() != a.digest() and c.critic_optimizer.step_count == 3


# ---- configuration ----------------------------------------------------------------------

@pytest.mark.parametrize("field,value", [
    ("actor_lr", 0.0), ("critic_lr", -1e-3), ("tau", 0.0), ("tau", 1.5), ("tau", float("nan")),
    ("hidden", []), ("hidden", [64, 0]), ("grad_clip", -1.0), ("action_noise", -0.1),
    ("noise_spread", -1.0), ("random_steps", -1), ("action_noise", float("inf"))])
def test_bad_config_names_its_field(field, value):
    with pytest.raises(ConfigError, match=f"^{field}: "):
        DDPGConfig(**{field: value}).validate()


def test_defaults():
    DDPGConfig().validate()
    assert DDPGConfig().hidden == [400, 300]
    assert DDPG.run_defaults == {"gamma": 0.98, "batch_size": 256, "learning_starts": 10_000,
                                 "replay_ratio": 256.0, "n_step": 1, "replay_capacity": 200_000}
    assert small().signature() == {"algo": "ddpg", "obs_shape": [3], "hidden": [8, 8],
                                   "action_space": str(ACT)}
