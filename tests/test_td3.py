"""TD3 on top of DDPG: the delayed phase schedule, target policy smoothing, the twin-critic
loss against hand computation, learners staying identical across delayed actor steps, a
checkpoint round trip with the noise generator, config validation, and a short
Pendulum learning check."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.wrappers import RescaleAction

from pal_hpc.algos.td3 import TD3, TD3Config, smooth_target_action
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


def small(seed=0, **kw) -> TD3:
    return TD3(OBS, ACT, TD3Config(hidden=[8, 8], **kw), seed=seed)


def test_phases_schedule_is_a_function_of_the_update_number():
    a, b = small(), small(policy_delay=3)
    update(a, 0, make_batch(np.random.default_rng(0), 4))   # state does not matter
    c, a_ = ("critic",), ("critic", "actor")
    assert [a.phases(u) for u in range(6)] == [c, a_, c, a_, c, a_]
    assert [b.phases(u) for u in range(6)] == [c, c, a_, c, c, a_]
    assert [small(policy_delay=1).phases(u) for u in range(2)] == [a_, a_]


def test_target_smoothing_noise_is_clipped():
    mean = torch.linspace(-1, 1, 2001).reshape(-1, 1).repeat(1, 2)
    g, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    smoothed = smooth_target_action(mean, 10.0, 0.5, g)
    expected = (mean + (10.0 * torch.randn(mean.shape, generator=g2)).clamp(-0.5, 0.5)).clamp(-1, 1)
    assert torch.equal(smoothed, expected)
    assert smoothed.abs().max() <= 1 and (smoothed - mean).abs().max() <= 0.5 + 1e-6
    inner = mean.abs() <= 0.5     # where the [-1, 1] clip cannot bite, the noise is at +-0.5
    assert ((smoothed - mean).abs()[inner] > 0.5 - 1e-6).float().mean() > 0.9
    assert (smoothed.abs() == 1).any()   # and the action clip does bite near the edges

    algo = small(target_noise=0.2, noise_clip=0.5)
    obs = torch.as_tensor(make_batch(np.random.default_rng(0), 5000)["next_obs"])
    with torch.no_grad():
        mu = algo.actor_target(obs)
        noise = algo.target_action(obs) - mu
    assert noise.abs().max() <= 0.5 + 1e-6
    inside = (mu.abs() < 0.3)    # away from the [-1, 1] clip
    assert noise[inside].std().item() == pytest.approx(0.2 * 0.9545 ** 0.5, rel=0.1)
    with torch.no_grad():
        assert torch.equal(small(target_noise=0.0).target_action(obs), mu)


def test_twin_critic_loss_and_priorities_by_hand():
    algo = small(seed=3)
    update(algo, 0, make_batch(np.random.default_rng(5), 6))      # online != target critics
    batch = make_batch(np.random.default_rng(4), 6)
    replay = torch.Generator()
    replay.set_state(algo.noise_generator.get_state())
    noise = torch.randn((6, 2), generator=replay).double().numpy()
    loss, stats, prio = algo.critic_loss(batch)

    def q(net, obs, act):
        return mlp_np(net.mlp, np.concatenate([obs, act], axis=1).astype(np.float64))[:, 0]

    mu = np.tanh(mlp_np(algo.actor_target.mlp, batch["next_obs"].astype(np.float64)))
    next_a = np.clip(mu + np.clip(0.2 * noise, -0.5, 0.5), -1, 1)
    next_q = np.minimum(*(q(t, batch["next_obs"], next_a) for t in algo.critic_target))
    assert not np.allclose(q(algo.critic_target[0], batch["next_obs"], next_a), next_q)
    target = batch["reward"] + batch["discount"] * next_q
    tds = [target - q(c, batch["obs"], batch["action"]) for c in algo.critics]
    expected = sum(np.mean(batch["weights"] * td ** 2) for td in tds)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert stats["critic_loss"] == pytest.approx(expected, rel=1e-5)
    np.testing.assert_allclose(prio, (np.abs(tds[0]) + np.abs(tds[1])) / 2, rtol=1e-5, atol=1e-6)


def test_learners_stay_identical_across_delayed_actor_steps():
    learners = [small(seed=11), small(seed=11)]
    rng = np.random.default_rng(0)
    for u in range(6):
        actor_before = learners[0].policy_params()
        batches = [make_batch(rng, 16) for _ in learners]   # each samples its own batch
        for phase in learners[0].phases(u):
            outs = [np.zeros(algo.phase_size(phase), np.float32) for algo in learners]
            for algo, batch, out in zip(learners, batches, outs):
                algo.compute_gradients(phase, batch, out)
            total = outs[0] + outs[1]                       # what the Allreduce returns
            for algo in learners:
                algo.apply_gradients(phase, total, scale=0.5)
        assert learners[0].digest() == learners[1].digest()
        moved = not np.array_equal(actor_before, learners[0].policy_params())
        assert moved == (u % 2 == 1)
    assert (learners[0].updates, learners[0].actor_updates) == (6, 3)


def test_same_seed_same_state_and_noise():
    state = torch.get_rng_state()
    a, b = small(seed=5), small(seed=5)
    assert torch.equal(torch.get_rng_state(), state)
    assert a.digest() == b.digest() != small(seed=6).digest()
    obs = torch.zeros(4, 3)
    with torch.no_grad():
        assert torch.equal(a.target_action(obs), b.target_action(obs))
        assert not torch.equal(small(seed=6).target_action(obs), a.target_action(obs))


def test_state_dict_round_trip_includes_the_noise_generator():
    a = small(seed=12)
    batch = make_batch(np.random.default_rng(1), 8)
    for u in range(3):
        update(a, u, batch)
    state = a.state_dict()
    b = small(seed=13)
    b.load_state_dict(state)
    assert a.digest() == b.digest()
    assert (b.updates, b.actor_updates) == (3, 1)
    assert torch.equal(a.noise_generator.get_state(), b.noise_generator.get_state())
    assert b.actor_optimizer.step_count == 1 and b.critic_optimizer.step_count == 3
    for u in (3, 4):          # a critic-only update, then one with the delayed actor
        update(a, u, batch)
        update(b, u, batch)
        assert a.digest() == b.digest()


@pytest.mark.parametrize("field,value", [
    ("policy_delay", 0), ("target_noise", -0.2), ("noise_clip", -0.5),
    ("target_noise", float("nan")), ("tau", 2.0), ("critic_lr", 0.0)])
def test_bad_config_names_its_field(field, value):
    with pytest.raises(ConfigError, match=f"^{field}: "):
        TD3Config(**{field: value}).validate()


def test_defaults():
    cfg = TD3Config()
    cfg.validate()
    assert (cfg.policy_delay, cfg.target_noise, cfg.noise_clip, cfg.tau) == (2, 0.2, 0.5, 0.005)
    assert (cfg.actor_lr, cfg.critic_lr, cfg.hidden, cfg.random_steps) == (1e-3, 1e-3, [400, 300],
                                                                          10_000)
    assert TD3.run_defaults["gamma"] == 0.98 and TD3.name == "td3"
    assert small().signature()["algo"] == "td3"


# ---- learning ------------------------------------------------------------------------------

@pytest.mark.slow
def test_td3_learns_pendulum():
    """TD3 on Pendulum-v1 in a plain loop: uniform replay, 1 update of 256 per env step
    after 1000 random steps; the greedy return must beat -400 within 12k steps."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)      # small nets: threads only add overhead
    try:
        start = time.perf_counter()
        ret = _train_pendulum(total_steps=12_000, start_steps=1_000, hidden=[64, 64])
        print(f"TD3 Pendulum-v1: greedy return {ret:.1f} after 12k steps "
              f"in {time.perf_counter() - start:.1f}s")
        assert ret > -400
    finally:
        torch.set_num_threads(threads)


def _train_pendulum(total_steps: int, start_steps: int, hidden: list[int]) -> float:
    env = RescaleAction(gym.make("Pendulum-v1"), -1.0, 1.0)
    cfg = TD3Config(hidden=hidden, random_steps=start_steps)
    algo = TD3(env.observation_space, env.action_space, cfg, seed=0)
    policy = algo.make_policy(0, 1)
    rng = np.random.default_rng(0)
    obs_buf = np.zeros((total_steps, 3), np.float32)
    next_buf = np.zeros_like(obs_buf)
    act_buf = np.zeros((total_steps, 1), np.float32)
    rew_buf = np.zeros(total_steps, np.float32)
    disc_buf = np.zeros(total_steps, np.float32)
    grads = {p: np.zeros(algo.phase_size(p), np.float32) for p in ("critic", "actor")}
    obs, _ = env.reset(seed=0)
    for t in range(total_steps):
        policy.set_flat_params(algo.policy_params())
        action = policy.act(obs[None], rng, t)[0]
        next_obs, reward, terminated, truncated, _ = env.step(action)
        obs_buf[t], act_buf[t], rew_buf[t], next_buf[t] = obs, action, reward, next_obs
        disc_buf[t] = 0.0 if terminated else 0.98
        obs = next_obs
        if terminated or truncated:
            obs, _ = env.reset()
        if t + 1 >= start_steps:
            idx = rng.integers(0, t + 1, 256)
            batch = {"obs": obs_buf[idx], "action": act_buf[idx], "reward": rew_buf[idx],
                     "next_obs": next_buf[idx], "discount": disc_buf[idx],
                     "weights": np.ones(256, np.float32)}
            u = t + 1 - start_steps
            for phase in algo.phases(u):
                algo.compute_gradients(phase, batch, grads[phase])
                algo.apply_gradients(phase, grads[phase])
    policy.set_flat_params(algo.policy_params())
    returns = []
    for episode in range(5):
        obs, _ = env.reset(seed=1000 + episode)
        done, total = False, 0.0
        while not done:
            action = policy.act(obs[None], rng, 1e9, deterministic=True)[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total += reward
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns))
