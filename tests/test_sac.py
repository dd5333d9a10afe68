"""SAC maths: shapes, the squashed-Gaussian log-prob against torch.distributions, acting,
the critic target against hand computation, the temperature's direction, determinism
and checkpoints, and a short Pendulum learning check."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Normal, TransformedDistribution
from torch.distributions.transforms import TanhTransform

from pal_hpc.algos.sac import SAC, SACConfig, squashed_gaussian
from pal_hpc.config import ConfigError

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def small(**kw) -> SACConfig:
    return SACConfig(hidden=[16, 16], **kw)


def make_batch(rng: np.random.Generator, b: int, obs_dim=3, act_dim=2) -> dict:
    """A random loss batch with the documented dtypes."""
    return {
        "obs": rng.standard_normal((b, obs_dim)).astype(np.float32),
        "action": rng.uniform(-1, 1, (b, act_dim)).astype(np.float32),
        "reward": rng.standard_normal(b).astype(np.float32),
        "next_obs": rng.standard_normal((b, obs_dim)).astype(np.float32),
        "discount": (0.99 * (rng.random(b) > 0.2)).astype(np.float32),
        "weights": rng.uniform(0.1, 1.0, size=b).astype(np.float32),
    }


def update(sac: SAC, batch: dict, metrics: bool = False) -> tuple[dict, np.ndarray]:
    """One full update on one learner, through the contract."""
    stats, prio = {}, None
    for phase in sac.phases(sac.updates):
        out = np.empty(sac.phase_size(phase), np.float32)
        s, p = sac.compute_gradients(phase, batch, out, metrics)
        sac.apply_gradients(phase, out)
        stats.update(s)
        prio = p if p is not None else prio
    return stats, prio


# ---- shapes, dtypes, acting ----------------------------------------------------------------

def test_shapes_dtypes_and_metrics():
    sac = SAC(OBS, ACT, small())
    assert sac.phases(0) == sac.phases(7) == ("critic", "actor")
    batch = make_batch(np.random.default_rng(0), 8)
    stats, prio = update(sac, batch, metrics=True)
    assert set(stats) == set(SAC.metric_names)
    assert all(isinstance(v, float) and np.isfinite(v) for v in stats.values())
    assert prio.shape == (8,) and prio.dtype == np.float64 and (prio >= 0).all()
    out = np.empty(sac.phase_size("actor"), np.float32)
    assert sac.compute_gradients("actor", batch, out) == ({}, None)
    n_actor = sum(p.numel() for p in sac.actor.parameters())
    assert sac.phase_size("actor") == n_actor + 1
    assert sac.phase_size("critic") == sum(p.numel() for p in sac.critic.parameters())
    params = sac.policy_params()
    assert params.shape == (n_actor,) and params.dtype == np.float32
    with pytest.raises(ValueError, match="phases"):
        sac.phase_size("q")
    with pytest.raises(ValueError, match="float32"):
        sac.compute_gradients("critic", batch, np.empty(3, np.float32))


def test_check_env_wants_box():
    SAC.check_env("Pendulum-v1", OBS, ACT)
    with pytest.raises(ConfigError, match="^env: sac needs a Box"):
        SAC.check_env("CartPole-v1", OBS, gym.spaces.Discrete(2))


def test_policy_actions_in_range_and_follow_the_published_params():
    sac = SAC(OBS, ACT, small(random_steps=0), seed=3)
    policy = sac.make_policy(0, 1)
    obs = np.random.default_rng(0).standard_normal((64, 3)).astype(np.float32) * 100
    for det in (False, True):
        a = policy.act(obs, np.random.default_rng(1), 10, deterministic=det)
        assert a.shape == (64, 2) and a.dtype == np.float32
        assert (np.abs(a) <= 1).all()
    other = SAC(OBS, ACT, small(random_steps=0), seed=4).make_policy(0, 1)
    assert other.num_params == policy.num_params
    other.set_flat_params(sac.policy_params())
    np.testing.assert_array_equal(other.act(obs, None, 10, deterministic=True),
                                  policy.act(obs, None, 10, deterministic=True))


def test_deterministic_is_tanh_mean_and_stochastic_uses_the_actor_rng():
    sac = SAC(OBS, ACT, small(random_steps=50), seed=1)
    policy = sac.make_policy(2, 4)
    obs = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    with torch.no_grad():
        mean, log_std = sac.actor(torch.as_tensor(obs))
    # The policy is numpy's (acting.SquashedGaussianPolicy): torch's to float32 rounding.
    close = dict(rtol=1e-5, atol=1e-6)
    for steps in (0, 10_000):  # the evaluation policy ignores the random phase
        np.testing.assert_allclose(policy.act(obs, None, steps, deterministic=True),
                                   torch.tanh(mean).numpy(), **close)
    noise = np.random.default_rng(9).standard_normal((5, 2)).astype(np.float32)
    expect = torch.tanh(mean + log_std.exp() * torch.as_tensor(noise)).numpy()
    got = policy.act(obs, np.random.default_rng(9), 50)
    np.testing.assert_allclose(got, expect, **close)
    # Same rng, same actions; no torch RNG involved.
    state = torch.get_rng_state()
    a = policy.act(obs, np.random.default_rng(9), 60)
    assert torch.equal(torch.get_rng_state(), state)
    np.testing.assert_array_equal(a, got)


def test_random_phase_before_random_steps():
    sac = SAC(OBS, ACT, small(random_steps=100), seed=1)
    policy = sac.make_policy(0, 1)
    obs = np.zeros((4000, 3), np.float32)  # one state: the policy would barely vary
    a = policy.act(obs, np.random.default_rng(5), 99)
    np.testing.assert_array_equal(
        a, np.random.default_rng(5).uniform(-1, 1, (4000, 2)).astype(np.float32))
    assert a.min() < -0.99 and a.max() > 0.99 and abs(a.mean()) < 0.03
    after = policy.act(obs, np.random.default_rng(5), 100)
    assert not np.array_equal(after, a)


# ---- the maths --------------------------------------------------------------------------

def test_log_prob_matches_torch_distributions():
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(256, 3, generator=g) * 3
    log_std = torch.rand(256, 3, generator=g) * 4 - 3
    noise = torch.randn(256, 3, generator=g)
    action, logp = squashed_gaussian(mean, log_std, noise)
    tanh = TanhTransform(cache_size=1)  # log_prob reads back the exact pre-tanh value
    u = mean + log_std.exp() * noise
    dist = TransformedDistribution(Normal(mean, log_std.exp()), [tanh])
    expect = dist.log_prob(tanh(u)).sum(-1)
    torch.testing.assert_close(action, torch.tanh(u))
    torch.testing.assert_close(logp, expect, rtol=1e-5, atol=1e-4)
    # Saturated pre-tanh values: the stable form stays finite where log(1 - tanh^2) is -inf.
    _, logp = squashed_gaussian(torch.full((1, 2), 30.0), torch.zeros(1, 2), torch.zeros(1, 2))
    assert torch.isfinite(logp).all() and logp.item() > 50


def _mlp_np(layers, x):
    for i, layer in enumerate(layers):
        x = x @ layer.weight.detach().double().numpy().T + layer.bias.detach().double().numpy()
        if i < len(layers) - 1:
            x = np.maximum(x, 0)
    return x


def test_critic_target_and_loss_against_hand_computation():
    sac = SAC(OBS, ACT, small(init_alpha=0.3), seed=2)
    rng = np.random.default_rng(1)
    for _ in range(3):  # let the target drift from the critic
        update(sac, make_batch(rng, 16))
    batch = make_batch(rng, 4)
    batch["discount"][0] = 0.0
    noise = rng.standard_normal((4, 2)).astype(np.float32)

    out = _mlp_np(sac.actor.net.layers, batch["next_obs"].astype(np.float64))
    mean, log_std = out[:, :2], np.clip(out[:, 2:], -20, 2)
    u = mean + np.exp(log_std) * noise
    a2 = np.tanh(u)
    logp = (-0.5 * noise ** 2 - log_std - 0.5 * np.log(2 * np.pi)
            - np.log(1 - np.tanh(u) ** 2)).sum(1)
    x2 = np.concatenate([batch["next_obs"], a2], 1)
    q_next = np.minimum(_mlp_np(sac.critic_target.q1.layers, x2),
                        _mlp_np(sac.critic_target.q2.layers, x2))[:, 0]
    alpha = np.exp(sac.temperature.log_alpha.item())
    target = batch["reward"] + batch["discount"] * (q_next - alpha * logp)
    assert target[0] == pytest.approx(batch["reward"][0])

    x = np.concatenate([batch["obs"], batch["action"]], 1)
    d1 = _mlp_np(sac.critic.q1.layers, x)[:, 0] - target
    d2 = _mlp_np(sac.critic.q2.layers, x)[:, 0] - target
    loss, stats, prio = sac.critic_loss(batch, noise=torch.as_tensor(noise))
    np.testing.assert_allclose(prio, 0.5 * (np.abs(d1) + np.abs(d2)), rtol=1e-4, atol=1e-5)
    assert loss.item() == pytest.approx(0.5 * np.mean(batch["weights"] * (d1**2 + d2**2)),
                                        rel=1e-4)
    assert stats["td_abs_mean"] == pytest.approx(prio.mean(), rel=1e-6)


def test_target_critic_follows_by_polyak_after_each_critic_step():
    sac = SAC(OBS, ACT, small(tau=0.1), seed=4)
    rng = np.random.default_rng(0)
    for _ in range(2):
        critic_old, target_old, _ = sac.state_arrays()
        update(sac, make_batch(rng, 16))
        critic, target, _ = sac.state_arrays()
        assert not np.array_equal(critic, critic_old)
        np.testing.assert_allclose(target, 0.9 * target_old + 0.1 * critic, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("target_entropy, direction", [(-50.0, -1), (50.0, 1)])
def test_temperature_moves_toward_the_target_entropy(target_entropy, direction):
    # Entropy of a 2-D policy is near 1 at init: above -50 (alpha falls), below 50 (rises).
    sac = SAC(OBS, ACT, small(target_entropy=target_entropy), seed=0)
    rng = np.random.default_rng(0)
    alphas = [sac.alpha]
    for _ in range(3):
        update(sac, make_batch(rng, 32))
        alphas.append(sac.alpha)
    assert (np.sign(np.diff(alphas)) == direction).all(), alphas


def test_default_target_entropy_is_minus_act_dim():
    assert SAC(OBS, ACT, small()).target_entropy == -2.0
    assert SAC(OBS, ACT, small(target_entropy=0.5)).target_entropy == 0.5


def test_grad_clip_leaves_log_alpha_alone():
    rng = np.random.default_rng(0)
    a = SAC(OBS, ACT, small(grad_clip=1e-3), seed=0)
    b = SAC(OBS, ACT, small(), seed=0)
    batch = make_batch(rng, 32)
    for sac in (a, b):
        update(sac, batch)
    assert a.alpha == b.alpha  # the temperature's step is not clipped
    assert not np.array_equal(a.policy_params(), b.policy_params())


# ---- determinism and state ---------------------------------------------------------------

def test_same_seed_same_params_and_no_global_rng_side_effect():
    state = torch.get_rng_state()
    a, b, c = SAC(OBS, ACT, small(), seed=7), SAC(OBS, ACT, small(), seed=7), \
        SAC(OBS, ACT, small(), seed=8)
    update(a, make_batch(np.random.default_rng(0), 8))
    assert torch.equal(torch.get_rng_state(), state)
    assert SAC(OBS, ACT, small(), seed=7).digest() == b.digest() != c.digest()
    assert all(torch.equal(p, q) for p, q in zip(b.critic.parameters(),
                                                 b.critic_target.parameters()))


def test_learners_applying_the_same_averaged_gradients_stay_identical():
    a, b = SAC(OBS, ACT, small(), seed=3), SAC(OBS, ACT, small(), seed=3)
    rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(2)
    digests = {a.digest()}
    for u in range(5):
        batch_a, batch_b = make_batch(rng_a, 16), make_batch(rng_b, 16)  # own samples
        for phase in a.phases(u):
            ga = np.empty(a.phase_size(phase), np.float32)
            gb = np.empty_like(ga)
            a.compute_gradients(phase, batch_a, ga)
            b.compute_gradients(phase, batch_b, gb)
            assert not np.array_equal(ga, gb)
            total = ga + gb  # the Allreduce
            a.apply_gradients(phase, total, scale=0.5)
            b.apply_gradients(phase, total, scale=0.5)
        assert a.digest() == b.digest()
        digests.add(a.digest())
    assert len(digests) == 6 and a.updates == 5


def test_state_dict_round_trip_is_exact():
    rng = np.random.default_rng(0)
    a = SAC(OBS, ACT, small(), seed=1)
    for _ in range(3):
        update(a, make_batch(rng, 16))
    state = a.state_dict()
    for value in _leaves(state):
        assert isinstance(value, (torch.Tensor, np.ndarray, int, float, str))
    b = SAC(OBS, ACT, small(), seed=99)
    b.load_state_dict(state)
    assert b.digest() == a.digest() and b.updates == a.updates == 3
    batch = make_batch(rng, 16)
    (sa, pa), (sb, pb) = update(a, batch, True), update(b, batch, True)
    assert a.digest() == b.digest()  # same noise stream, same optimizer moments
    assert sa == sb
    np.testing.assert_array_equal(pa, pb)
    # state_dict is a snapshot: later updates leave it alone.
    c = SAC(OBS, ACT, small(), seed=5)
    c.load_state_dict(state)
    assert c.digest() != a.digest() and c.updates == 3


def _leaves(d):
    for v in d.values():
        yield from _leaves(v) if isinstance(v, dict) else [v]


def test_signature_names_the_shapes():
    sig = SAC(OBS, ACT, small()).signature()
    assert sig["algo"] == "sac" and sig["hidden"] == [16, 16] and sig["obs_shape"] == [3]


# ---- configuration ----------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("lr", 0.0), ("lr", float("nan")), ("tau", 0.0), ("tau", 1.5), ("init_alpha", 0.0),
    ("init_alpha", float("inf")), ("hidden", []), ("hidden", [64, 0]),
    ("target_entropy", float("nan")), ("random_steps", -1), ("grad_clip", -1.0)])
def test_bad_config_names_its_field(field, value):
    with pytest.raises(ConfigError, match=f"^{field}: "):
        SACConfig(**{field: value}).validate()


def test_defaults_validate():
    cfg = SACConfig()
    cfg.validate()
    assert (cfg.lr, cfg.tau, cfg.hidden, cfg.init_alpha, cfg.target_entropy) == \
        (3e-4, 0.005, [256, 256], 1.0, None)
    assert SAC.run_defaults["batch_size"] == 256 and SAC.run_defaults["n_step"] == 1


# ---- learning ---------------------------------------------------------------------------

def greedy_return(policy, env, episodes: int, seed: int) -> float:
    total = 0.0
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done = False
        while not done:
            action = policy.act(obs[None].astype(np.float32), None, 0, deterministic=True)[0]
            obs, reward, term, trunc, _ = env.step(action)
            total += reward
            done = term or trunc
    return total / episodes


@pytest.mark.slow
def test_learns_pendulum():
    """Single process: a ring buffer, uniform sampling, one update of 256 per env step
    after 100 random steps, lr 1e-3 (rl-baselines3-zoo's Pendulum setting)."""
    start = time.perf_counter()
    env = gym.wrappers.RescaleAction(gym.make("Pendulum-v1"), -1.0, 1.0)
    eval_env = gym.wrappers.RescaleAction(gym.make("Pendulum-v1"), -1.0, 1.0)
    cfg = SACConfig(lr=1e-3, hidden=[64, 64], random_steps=100)
    sac = SAC(env.observation_space, env.action_space, cfg, seed=0)
    policy = sac.make_policy(0, 1)
    rng = np.random.default_rng(0)
    cap, n_steps, batch_size = 10_000, 10_000, 256
    buf = {"obs": np.zeros((cap, 3), np.float32), "action": np.zeros((cap, 1), np.float32),
           "reward": np.zeros(cap, np.float32), "next_obs": np.zeros((cap, 3), np.float32),
           "discount": np.zeros(cap, np.float32)}
    grads = {p: np.empty(sac.phase_size(p), np.float32) for p in ("critic", "actor")}
    obs, _ = env.reset(seed=0)
    returns = []
    for step in range(n_steps):
        action = policy.act(obs[None], rng, step)[0]
        next_obs, reward, term, trunc, _ = env.step(action)
        i = step % cap
        buf["obs"][i], buf["action"][i], buf["reward"][i] = obs, action, reward
        buf["next_obs"][i], buf["discount"][i] = next_obs, 0.0 if term else 0.99
        obs = next_obs
        if term or trunc:
            obs, _ = env.reset()
        if step >= 100:
            idx = rng.integers(0, min(step + 1, cap), batch_size)
            batch = {k: v[idx] for k, v in buf.items()}
            batch["weights"] = np.ones(batch_size, np.float32)
            for phase in sac.phases(sac.updates):
                sac.compute_gradients(phase, batch, grads[phase])
                sac.apply_gradients(phase, grads[phase])
            policy.set_flat_params(sac.policy_params())
        if step >= 3_000 and (step + 1) % 1_000 == 0:
            returns.append(greedy_return(policy, eval_env, 5, seed=1000))
            if returns[-1] > -400:
                break
    elapsed = time.perf_counter() - start
    print(f"pendulum: greedy returns {np.round(returns, 1)} after {step + 1} steps, "
          f"{elapsed:.1f}s")
    assert returns[-1] > -400, returns
