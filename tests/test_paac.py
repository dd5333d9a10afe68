"""PAAC: the n-step returns (bootstrapping, cuts at episode ends, the reset step of
next-step autoreset left out), the loss's gradient against a reference written apart,
RMSProp against torch and TensorFlow 1's formula, the learning-rate annealing, and the
on-policy runtime through the real entry point (1 and 3 ranks, two virtual nodes with
bit-identical masters, SIGTERM + exact resume, bad flags, `python -m pal_hpc.analyze`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import gymnasium as gym
import h5py
import numpy as np
import pytest
import torch

from conftest import ROOT, STOP_SIGNAL, mpi_env
from pal_hpc.algos import ALGOS, PAAC
from pal_hpc.algos.optim import FlatRMSProp
from pal_hpc.algos.paac import PAACConfig, nstep_returns, resolve_num_envs, sample_actions
from pal_hpc.cluster.launch import pal_main
from pal_hpc.config import ConfigError
from pal_hpc.config_io import config_from_dict, config_to_dict, load_config
from pal_hpc.io.metrics import read_run_metrics

GAMMA = 0.9
OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)


def make(seed=0, gamma=GAMMA, **fields) -> PAAC:
    return PAAC(OBS, gym.spaces.Discrete(3), PAACConfig(**{"hidden": [16], **fields}),
                seed=seed, gamma=gamma)


def rollout(rng, t_max=5, n=4, dones=()):
    """A random round; `dones` lists (t, env, "term"|"trunc") episode ends, each
    followed by its reset step."""
    batch = {"obs": rng.normal(size=(t_max + 1, n, 4)).astype(np.float32),
             "action": rng.integers(0, 3, size=(t_max, n)),
             "reward": rng.normal(size=(t_max, n)).astype(np.float32),
             "terminated": np.zeros((t_max, n), bool), "truncated": np.zeros((t_max, n), bool),
             "valid": np.ones((t_max, n), bool)}
    for t, i, kind in dones:
        batch["terminated" if kind == "term" else "truncated"][t, i] = True
        if t + 1 < t_max:
            batch["valid"][t + 1, i] = False
    return batch


def grad_of(algo: PAAC, batch) -> np.ndarray:
    out = np.full(algo.num_params, np.nan, np.float32)
    algo.compute_gradients("ac", batch, out)
    return out


# ---- returns ------------------------------------------------------------------------

def test_returns_bootstrap_from_the_last_value():
    r = np.array([[1.0], [2.0], [3.0]])
    v = np.array([[0.5], [0.5], [0.5], [10.0]])
    no = np.zeros((3, 1), bool)
    got = nstep_returns(r, v, no, no, GAMMA)
    g = GAMMA
    want = [1 + g * 2 + g * g * 3 + g ** 3 * 10, 2 + g * 3 + g * g * 10, 3 + g * 10]
    np.testing.assert_allclose(got[:, 0], want)


def test_returns_cut_at_termination_and_bootstrap_at_truncation():
    # env 0 terminates at t=1, env 1 is truncated at t=1; t=2 is their reset step.
    r = np.array([[1.0, 1.0], [2.0, 2.0], [0.0, 0.0], [4.0, 4.0]])
    v = np.array([[0.0, 0.0], [0.0, 0.0], [7.0, 7.0], [0.0, 0.0], [5.0, 5.0]])
    term = np.zeros((4, 2), bool)
    trunc = np.zeros((4, 2), bool)
    term[1, 0] = trunc[1, 1] = True
    got = nstep_returns(r, v, term, trunc, GAMMA)
    assert got[1, 0] == 2.0                         # nothing after a termination
    assert got[0, 0] == 1.0 + GAMMA * 2.0
    assert got[1, 1] == pytest.approx(2.0 + GAMMA * 7.0)   # V(last obs of the episode)
    assert got[0, 1] == pytest.approx(1.0 + GAMMA * (2.0 + GAMMA * 7.0))
    assert got[3, 0] == pytest.approx(4.0 + GAMMA * 5.0)   # the new episode bootstraps


def test_reset_step_is_not_learned_from():
    """The step after an episode's end (next-step autoreset) is no transition: its
    reward and action must not change the gradient; the mask must matter."""
    rng = np.random.default_rng(0)
    algo = make()
    batch = rollout(rng, dones=[(1, 0, "term"), (2, 3, "trunc")])
    base = grad_of(algo, batch)
    other = {k: v.copy() for k, v in batch.items()}
    other["reward"][2, 0] = 1e3
    other["action"][2, 0] = (batch["action"][2, 0] + 1) % 3
    other["reward"][3, 3] = -1e3
    np.testing.assert_array_equal(grad_of(algo, other), base)
    other["valid"][:] = True                        # learning from them changes it
    assert not np.allclose(grad_of(algo, other), base)


# ---- the loss and its gradient ------------------------------------------------------------

def reference_loss(algo: PAAC, batch) -> torch.Tensor:
    """The PAAC loss written step by step, per environment and per time step."""
    cfg = algo.config
    t_max, n = batch["reward"].shape
    logits, values = algo.net(torch.as_tensor(batch["obs"].reshape(-1, 4)))
    logits, values = logits.view(t_max + 1, n, -1), values.view(t_max + 1, n)
    terms = []
    for i in range(n):
        ret = None
        rets = {}
        for t in reversed(range(t_max)):
            if batch["terminated"][t, i]:
                ret = float(batch["reward"][t, i])
            elif batch["truncated"][t, i]:
                ret = float(batch["reward"][t, i]) + GAMMA * values[t + 1, i].item()
            else:
                nxt = values[t_max, i].item() if ret is None else ret
                ret = float(batch["reward"][t, i]) + GAMMA * nxt
            rets[t] = ret
        for t in range(t_max):
            if not batch["valid"][t, i]:
                continue
            logp = torch.log_softmax(logits[t, i], -1)
            adv = rets[t] - values[t, i].item()
            entropy = -(logp.exp() * logp).sum()
            terms.append(-logp[batch["action"][t, i]] * adv
                         + cfg.value_coef * (rets[t] - values[t, i]) ** 2
                         - cfg.entropy * entropy)
    return cfg.loss_scale * torch.stack(terms).mean()


def test_gradient_matches_a_reference_loss():
    rng = np.random.default_rng(1)
    algo = make(entropy=0.05)
    batch = rollout(rng, dones=[(0, 1, "term"), (3, 2, "trunc"), (4, 0, "term")])
    got = grad_of(algo, batch)
    loss = reference_loss(algo, batch)
    want = torch.autograd.grad(loss, list(algo.net.parameters()))
    np.testing.assert_allclose(got, torch.cat([g.reshape(-1) for g in want]).numpy(),
                               rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("fields", [
    {}, {"entropy": 0.05, "clip_rewards": "on"},
    {"shared_torso": False, "activation": "tanh", "hidden": [64, 64], "entropy": 0.0},
    {"shared_torso": False, "hidden": [16, 8], "loss_scale": 1.0, "init": "orthogonal"}])
def test_numpy_gradient_and_metrics_are_autograds(fields):
    """Small MLPs on the CPU take the loss's gradient through numpy (NumpyGrad): the
    gradient and every metric are autograd's to float32 rounding, rounds with reset
    steps, truncations and large rewards included, also after an update moved the
    parameters."""
    a = make(seed=3, **fields)
    assert a._np_grad is not None
    rng = np.random.default_rng(7)
    for dones in ([], [(0, 1, "term"), (3, 2, "trunc"), (4, 0, "term")]):
        batch = rollout(rng, dones=dones)
        batch["reward"] *= 3
        got = {}
        for path in ("numpy", "torch"):
            saved = a._np_grad
            a._np_grad = saved if path == "numpy" else None
            out = np.full(a.num_params, np.nan, np.float32)
            stats, _ = a.compute_gradients("ac", batch, out, metrics=True)
            a._np_grad = saved
            got[path] = out, stats
        np.testing.assert_allclose(got["numpy"][0], got["torch"][0], rtol=1e-5, atol=1e-6)
        assert set(got["numpy"][1]) == set(PAAC.metric_names)
        for k, v in got["torch"][1].items():
            assert got["numpy"][1][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
        a.apply_gradients("ac", got["numpy"][0])


def test_metrics_and_buffer_checks():
    algo = make(init="small-policy")
    batch = rollout(np.random.default_rng(2))
    out = np.zeros(algo.num_params, np.float32)
    stats, prio = algo.compute_gradients("ac", batch, out, metrics=True)
    assert prio is None and set(stats) == set(PAAC.metric_names)
    assert stats["entropy"] == pytest.approx(np.log(3), rel=1e-3)   # near-uniform at start
    # torch's init (the default, the released code's): a policy head as large as any
    # layer, so the first policy is not uniform
    torch_init = make()
    stats, _ = torch_init.compute_gradients("ac", batch, out, metrics=True)
    assert 0 < stats["entropy"] < np.log(3) * (1 - 1e-3)
    with pytest.raises(ValueError, match="float32"):
        algo.compute_gradients("ac", batch, np.zeros(algo.num_params))
    with pytest.raises(ValueError, match="one update phase"):
        algo.phase_size("q")


def test_rewards_clipped_on_request_only():
    batch = rollout(np.random.default_rng(3))
    batch["reward"] *= 10
    plain, clipped = make(), make(clip_rewards="on")
    assert not plain.clip_rewards and clipped.clip_rewards       # auto: not on vectors
    small = {**batch, "reward": np.clip(batch["reward"], -1, 1)}
    np.testing.assert_array_equal(grad_of(clipped, batch), grad_of(plain, small))


def test_policy_gradient_learns_a_bandit():
    """Action 2 pays 1, the others 0: a few updates make it the likeliest."""
    rng = np.random.default_rng(4)
    algo = make(entropy=0.0, lr=0.01, lr_anneal=False)
    for _ in range(60):
        obs = rng.normal(size=(2, 16, 4)).astype(np.float32)
        action = algo.act(obs[0], rng)[None]
        batch = {"obs": obs, "action": action, "reward": (action == 2).astype(np.float32),
                 "terminated": np.ones((1, 16), bool), "truncated": np.zeros((1, 16), bool),
                 "valid": np.ones((1, 16), bool)}
        algo.apply_gradients("ac", grad_of(algo, batch))
    probe = np.random.default_rng(5).normal(size=(256, 4)).astype(np.float32)
    acts = algo.make_policy().act(probe, rng, 0, deterministic=True)
    assert (acts == 2).mean() > 0.9


# ---- learning rate and optimizer ----------------------------------------------------------

def test_learning_rate_anneals_linearly_to_zero():
    algo = make(lr=0.02)
    assert algo.learning_rate(0.0) == 0.02
    assert algo.learning_rate(0.25) == pytest.approx(0.015)
    assert algo.learning_rate(1.0) == 0.0 and algo.learning_rate(1.5) == 0.0
    assert make(lr=0.02, lr_anneal=False).learning_rate(0.9) == 0.02
    # ... and the step takes it: no move at the end, half the first move at 1/2.
    grad = np.random.default_rng(6).normal(size=algo.num_params).astype(np.float32)
    moves = []
    for progress in (0.0, 0.5, 1.0):
        a = make(lr=0.02, grad_clip=0.0)
        before = a.policy_params()
        a.set_progress(progress)
        a.apply_gradients("ac", grad)
        moves.append(a.policy_params() - before)
    np.testing.assert_allclose(moves[1], moves[0] / 2, rtol=1e-4, atol=1e-8)
    assert not moves[2].any()


def test_lr_anneal_steps_sets_the_annealing_horizon():
    # 0 = over the run; the released code's horizon outlasts the run, so the rate
    # at the run's end is still most of the first.
    assert make().anneal_progress(500, 1000) == 0.5
    long = make(lr=0.02, lr_anneal_steps=80_000_000)
    assert long.anneal_progress(15_000_000, 15_000_000) == pytest.approx(0.1875)
    long.set_progress(long.anneal_progress(15_000_000, 15_000_000))
    assert long.learning_rate() == pytest.approx(0.02 * (1 - 0.1875))
    assert make(lr_anneal_steps=100).anneal_progress(300, 1000) == 1.0
    acfg = load_config(["--algo", "paac", "--lr-anneal-steps", "80000000"]).algo_config
    assert acfg.lr_anneal_steps == 80_000_000
    with pytest.raises(ConfigError, match="lr_anneal_steps"):
        load_config(["--algo", "paac", "--lr-anneal-steps", "-1"]).validate()


def test_rmsprop_torch_mode_matches_torch():
    rng = np.random.default_rng(7)
    start = torch.as_tensor(rng.normal(size=500), dtype=torch.float32)
    ours = start.clone()
    opt = FlatRMSProp(ours, lr=1e-2, decay=0.9, eps=1e-3, eps_in_sqrt=False, initial_square=0.0)
    ref = start.clone().requires_grad_(True)
    ref_opt = torch.optim.RMSprop([ref], lr=1e-2, alpha=0.9, eps=1e-3, foreach=False)
    for _ in range(10):
        g = torch.as_tensor(rng.normal(size=500) * 3, dtype=torch.float32)
        opt.step(g.clone(), clip_norm=5.0)
        ref.grad = g.clone()
        torch.nn.utils.clip_grad_norm_([ref], 5.0)
        ref_opt.step()
        np.testing.assert_allclose(ours.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-7)


def test_rmsprop_default_is_tensorflow1s_formula():
    rng = np.random.default_rng(8)
    p0 = rng.normal(size=300)
    p = torch.as_tensor(p0, dtype=torch.float32)
    opt = FlatRMSProp(p, lr=0.05, decay=0.99, eps=0.1)
    ms, ref = np.ones(300), p0.copy()
    for k in range(5):
        g = rng.normal(size=300)
        opt.step(torch.as_tensor(g, dtype=torch.float32), lr=0.05 / (k + 1))
        ms = 0.99 * ms + 0.01 * g * g
        ref -= 0.05 / (k + 1) * g / np.sqrt(ms + 0.1)
    np.testing.assert_allclose(p.numpy(), ref, rtol=1e-5, atol=1e-6)
    assert opt.steps == 5


def test_state_round_trip_continues_identically():
    rng = np.random.default_rng(9)
    a = make(seed=3)
    batches = [rollout(rng, dones=[(2, 1, "term")]) for _ in range(4)]
    for b in batches[:2]:
        a.apply_gradients("ac", grad_of(a, b))
    b_algo = make(seed=99)
    b_algo.load_state_dict(a.state_dict())
    assert b_algo.digest() == a.digest()
    for b in batches[2:]:
        a.set_progress(0.3)
        b_algo.set_progress(0.3)
        a.apply_gradients("ac", grad_of(a, b))
        b_algo.apply_gradients("ac", grad_of(b_algo, b))
    assert b_algo.digest() == a.digest() and a.updates == b_algo.updates == 4


# ---- network and optimizer options --------------------------------------------------------

def test_defaults_are_the_released_codes_loss():
    """loss = 5.0 * (actor mean + critic mean), critic 0.25 (R - V)^2 (Alfredvc/paac)."""
    acfg = load_config(["--algo", "paac"]).algo_config
    assert acfg.paac_preset == "paper" and acfg.loss_scale == 5.0 and acfg.value_coef == 0.25
    assert (acfg.lr, acfg.rms_style, acfg.rms_eps, acfg.grad_clip, acfg.entropy) == \
        (0.0224, "tf", 0.1, 3.0, 0.02)


def test_a2c_preset_sets_its_values_and_a_flag_wins():
    acfg = load_config(["--algo", "paac", "--paac-preset", "a2c", "--lr", "7e-4"]).algo_config
    assert (acfg.rms_style, acfg.rms_eps, acfg.grad_clip, acfg.entropy, acfg.value_coef,
            acfg.loss_scale, acfg.init) == ("torch", 1e-5, 0.5, 0.01, 0.25, 1.0, "orthogonal")
    assert acfg.lr == 7e-4                     # the flag, not the preset's 1e-3
    # A saved config (resume reads it back) keeps what the run used.
    again = config_from_dict(config_to_dict(load_config(["--algo", "paac", "--paac-preset",
                                                         "a2c", "--lr", "7e-4"])))
    assert again.algo_config == acfg
    with pytest.raises(ConfigError, match="paac_preset"):    # from a --config file
        config_from_dict({"algo": "paac", "paac_preset": "zoo"}).validate()


def test_loss_scale_scales_the_gradient_before_the_clip():
    rng = np.random.default_rng(10)
    batch = rollout(rng, dones=[(1, 2, "term")])
    base = grad_of(make(seed=4, loss_scale=1.0), batch)
    np.testing.assert_allclose(grad_of(make(seed=4, loss_scale=3.0), batch), 3.0 * base,
                               rtol=1e-5, atol=1e-7)


def test_rms_style_torch_is_torchs_rmsprop():
    algo = make(rms_style="torch", rms_eps=1e-5, lr=7e-4, grad_clip=0.5, lr_anneal=False)
    opt = algo.optimizer
    assert not opt.eps_in_sqrt and float(opt.square_avg.abs().max()) == 0.0
    ref = torch.nn.Parameter(torch.as_tensor(algo.policy_params()))
    ref_opt = torch.optim.RMSprop([ref], lr=7e-4, alpha=0.99, eps=1e-5, foreach=False)
    rng = np.random.default_rng(11)
    for _ in range(3):
        g = grad_of(algo, rollout(rng))
        algo.apply_gradients("ac", g)
        ref.grad = torch.as_tensor(g)
        torch.nn.utils.clip_grad_norm_([ref], 0.5)
        ref_opt.step()
    np.testing.assert_allclose(algo.policy_params(), ref.detach().numpy(), rtol=1e-5,
                               atol=1e-7)
    assert make().optimizer.eps_in_sqrt          # the default stays TensorFlow 1's


def test_separate_torsos_keep_value_and_policy_apart():
    shared, apart = make(seed=5), make(seed=5, shared_torso=False)
    assert apart.num_params > shared.num_params
    net = apart.net
    obs = torch.as_tensor(np.random.default_rng(12).normal(size=(6, 4)), dtype=torch.float32)
    logits, values = net(obs)
    with torch.no_grad():
        for p in net.value_trunk.parameters():
            p.add_(1.0)
    logits2, values2 = net(obs)
    torch.testing.assert_close(logits2, logits)          # the policy never sees it
    assert not torch.allclose(values2, values)
    assert apart.signature() != shared.signature()       # a checkpoint must match it


def test_tanh_activation_and_orthogonal_init():
    algo = make(seed=6, activation="tanh", init="orthogonal", shared_torso=False)
    mods = list(algo.net.modules())
    assert any(isinstance(m, torch.nn.Tanh) for m in mods)
    assert not any(isinstance(m, torch.nn.ReLU) for m in mods)
    w = algo.net.policy.weight.detach().double()          # (3, 16): orthogonal rows x 0.01
    torch.testing.assert_close(w @ w.T, 1e-4 * torch.eye(3, dtype=torch.float64))
    assert not algo.net.policy.bias.any() and not algo.net.value.bias.any()
    assert algo.signature()["activation"] == "tanh"
    default = make(seed=6)
    assert any(isinstance(m, torch.nn.ReLU) for m in default.net.modules())


@pytest.mark.parametrize("fields", [{}, {"activation": "tanh", "shared_torso": False},
                                    {"hidden": [32, 16]}])
def test_numpy_acting_follows_the_torch_network(fields):
    """Small MLPs on the CPU act through numpy (NumpyLogits): its logits are the torch
    network's, also after updates and after loading a state, and the actions drawn
    from them are those drawn from torch's logits with the same generator state."""
    rng = np.random.default_rng(4)
    a = make(seed=8, **fields)
    assert a._np_logits is not None
    obs = rng.normal(size=(9, 4)).astype(np.float32)

    def check():
        with torch.no_grad():
            want = a.net.logits(torch.as_tensor(obs))
        np.testing.assert_allclose(a._np_logits(obs), want.numpy(), rtol=1e-5, atol=1e-5)
        g1, g2 = np.random.default_rng(1), np.random.default_rng(1)
        np.testing.assert_array_equal(a.act(obs, g1), a._act_torch(obs, g2))
        assert g1.random() == g2.random()           # one draw each, no more

    check()
    for _ in range(3):                               # the views see every update
        a.apply_gradients("ac", grad_of(a, rollout(rng)))
    check()
    other = make(seed=99, **fields)
    a.load_state_dict(other.state_dict())            # ... and a loaded state
    check()
    a.net.float()                                    # a no-op move keeps the storage
    check()


def test_frames_gpus_and_bf16_act_through_torch():
    assert make(precision="bf16")._np_logits is None
    assert make(precision="bf16")._np_grad is None
    frames = PAAC(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(3),
                  PAACConfig(), seed=0)
    assert frames._np_logits is None and frames._np_grad is None


def test_sampling_takes_torch_or_numpy_logits_alike():
    logits = np.random.default_rng(2).normal(size=(50, 4)).astype(np.float32) * 3
    a = sample_actions(logits, np.random.default_rng(7))
    b = sample_actions(torch.as_tensor(logits), np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.int64 and set(a.tolist()) <= {0, 1, 2, 3}
    big = np.array([[0.0, 50.0, 0.0]] * 20, np.float32)       # no overflow: max first
    assert (sample_actions(big, np.random.default_rng(0)) == 1).all()


def test_inits_torch_small_policy_and_the_old_name():
    """torch (the default) is torch's own init in every layer, the released code's;
    small-policy scales the policy head's weights by 0.01 (its old name, default, still
    loads)."""
    bound = 1 / np.sqrt(16)                         # torch's, for the head's fan_in
    plain, small = make(seed=11), make(seed=11, init="small-policy")
    assert PAACConfig().init == "torch"
    w = plain.net.policy.weight.detach()
    assert w.abs().max() <= bound and w.abs().max() > bound / 2    # not scaled down
    assert plain.net.policy.bias.detach().abs().max() > 0
    torch.testing.assert_close(small.net.policy.weight, w * 0.01)
    assert not small.net.policy.bias.any()
    for a, b in zip(plain.net.trunk.parameters(), small.net.trunk.parameters()):
        torch.testing.assert_close(a, b)                              # the torso alike
    old = PAACConfig(init="default")
    old.validate()
    assert old.init == "small-policy"
    with pytest.raises(ConfigError, match="init: must be one of torch, small-policy"):
        PAACConfig(init="xavier").validate()


def test_bf16_precision_is_close_to_fp32_and_keeps_fp32_state():
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    rng = np.random.default_rng(13)
    batch = rollout(rng, t_max=2, n=3)
    batch["obs"] = rng.integers(0, 256, size=(3, 3, 4, 84, 84), dtype=np.uint8)
    batch["action"] = rng.integers(0, 6, size=(2, 3))
    algos = {p: PAAC(frames, gym.spaces.Discrete(6), PAACConfig(precision=p), seed=1)
             for p in ("fp32", "bf16")}
    grads = {p: grad_of(a, batch) for p, a in algos.items()}
    assert algos["bf16"].policy_params().dtype == np.float32
    assert grads["bf16"].dtype == np.float32 and np.isfinite(grads["bf16"]).all()
    assert not np.array_equal(grads["bf16"], grads["fp32"])        # bf16 did run
    cos = grads["bf16"] @ grads["fp32"] / (np.linalg.norm(grads["bf16"])
                                           * np.linalg.norm(grads["fp32"]))
    assert cos > 0.98, cos
    acts = algos["bf16"].act(batch["obs"][0], np.random.default_rng(0))
    assert acts.dtype == np.int64 and acts.shape == (3,) and ((0 <= acts) & (acts < 6)).all()


# ---- configuration ------------------------------------------------------------------------

def test_registry_spaces_and_num_envs():
    assert ALGOS["paac"] is PAAC and PAAC.on_policy
    assert PAAC.rollout_steps(PAACConfig(t_max=7)) == 7      # the spec's, torch-free
    with pytest.raises(ConfigError, match=r"env: paac needs a Discrete action space; "
                                          r"Pendulum-v1 has Box"):
        PAAC.check_env("Pendulum-v1", OBS, gym.spaces.Box(-1, 1, (1,)))
    assert resolve_num_envs(0, 0) == 32 and resolve_num_envs(0, 3) == 33
    assert resolve_num_envs(0, 8) == 32 and resolve_num_envs(12, 3) == 12
    with pytest.raises(ConfigError, match=r"num_envs: 32 .* 3 worker ranks.* 30 or 33"):
        resolve_num_envs(32, 3)
    for field, value in (("t_max", 0), ("lr", -1.0), ("rms_decay", 1.0), ("entropy", -0.1),
                         ("lr", float("nan")), ("loss_scale", 0.0),
                         ("loss_scale", float("inf")), ("rms_style", "adam"),
                         ("activation", "gelu"), ("init", "xavier"), ("precision", "fp16")):
        with pytest.raises(ConfigError, match=f"^{field}: "):
            PAACConfig(**{field: value}).validate()


# ---- through the entry point ----------------------------------------------------------------

FAST = ["--algo", "paac", "--eval-episodes", "2", "--progress-every", "0.5",
        "--hidden", "32", "32"]


def launch(n, run_dir, *flags, timeout=120):
    return subprocess.run(pal_main(n, *FAST, "--run-dir", str(run_dir), *flags), cwd=ROOT,
                          env=mpi_env(), capture_output=True, text=True, timeout=timeout)


def summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 3])
def test_trains_and_logs_through_the_entry_point(tmp_path, n):
    run_dir = tmp_path / "run"
    # With workers, --master-envs 0 has them step every env (auto would keep CartPole's
    # cheap envs on the master: tests/test_master_share.py).
    share = ["--master-envs", "0"] if n > 1 else []
    proc = launch(n, run_dir, "--total-steps", "4000", "--eval-every", "2000", *share)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = summary(run_dir)
    envs = 32                         # 0 or 2 workers: 32 envs, the paper's
    assert s["algo"] == "paac" and s["masters"] == 1 and s["env_workers"] == n - 1
    assert s["num_envs"] == [envs] and s["steps_per_update"] == 5 * envs
    assert s["env_steps"] >= 4000 and s["updates"] == -(-4000 // (5 * envs))
    assert s["episodes"] > 50 and s["stop_reason"] == "4000 env steps done"
    assert s["exit_status"] == 0 and s["checkpoint"]
    t = s["master_time"]
    assert 0 < t["busy"] < 1 and t["forward"] > 0 and t["update"] > 0 and t["env_wait"] > 0
    assert "paac: master time: busy" in proc.stdout
    if n == 1:
        assert s["env_worker_busy"] is None          # the master steps the envs itself
    else:
        assert 0 < s["env_worker_busy"] < 1
    log = read_run_metrics(run_dir)
    assert log["learner"].dtype.names[3:] == PAAC.metric_names
    assert len(log["learner"]) == s["updates"] // 10
    assert np.isfinite(log["learner"]["loss"]).all()
    assert len(log["episodes"]) == s["episodes"]
    assert set(log["episodes"]["actor"]) <= set(range(envs))
    assert len(log["evaluation"]) >= 2 and len(log["system"]) >= 1
    if n == 3:
        out = subprocess.run([sys.executable, "-m", "pal_hpc.analyze", str(run_dir)],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "complete" in out.stdout and (run_dir / "learning_curve_steps.png").exists()


@pytest.mark.mpi
def test_two_virtual_nodes_keep_identical_masters(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(4, run_dir, "--ranks-per-node", "2", "--num-envs", "8",
                  "--total-steps", "3000", "--eval-every", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = summary(run_dir)
    assert s["masters"] == 2 and s["nodes"] == 2 and s["num_envs"] == [8, 8]
    assert s["updates"] == -(-3000 // 80)
    assert s["learner_params_identical"]           # digests of both masters equal
    assert s["ranks_with_torch"] == [0, 2]         # the masters; the env workers never


@pytest.mark.mpi
def test_async_update_is_deterministic_and_keeps_masters_identical(tmp_path):
    """--async-update computes each gradient on a thread during the next round: the
    result must not depend on the threads' timing (two runs, one digest) and the two
    virtual nodes' masters must stay bit-identical."""
    digests = []
    for k in range(2):
        run_dir = tmp_path / f"run{k}"
        proc = launch(4, run_dir, "--ranks-per-node", "2", "--num-envs", "8",
                      "--total-steps", "3000", "--eval-every", "0", "--async-update")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        s = summary(run_dir)
        assert s["updates"] == -(-3000 // 80) and s["learner_params_identical"]
        assert s["master_time"]["update"] > 0 and "update_join" in s["master_time"]
        with h5py.File(s["checkpoint"], "r") as f:
            digests.append(f.attrs["params_digest"])
    assert digests[0] == digests[1]
    sync = tmp_path / "sync"                 # and it is not the synchronous schedule
    proc = launch(4, sync, "--ranks-per-node", "2", "--num-envs", "8",
                  "--total-steps", "3000", "--eval-every", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with h5py.File(summary(sync)["checkpoint"], "r") as f:
        assert f.attrs["params_digest"] != digests[0]


@pytest.mark.mpi
def test_sigterm_checkpoints_and_resume_is_exact(tmp_path):
    run_dir = tmp_path / "run"
    cmd = pal_main(3, *FAST, "--run-dir", str(run_dir), "--total-steps", "100000000",
                   "--eval-every", "0")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    for line in proc.stdout:                  # two progress lines: training is under way
        if "master busy" in line and "steps" in line:
            if time.monotonic() > deadline or "updates" in line and \
                    int(line.split("updates")[1].split()[0].replace(",", "")) > 20:
                break
    proc.send_signal(STOP_SIGNAL)             # SIGTERM; SIGUSR1 under Open MPI
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 75, out + err
    first = summary(run_dir)
    assert STOP_SIGNAL.name in first["stop_reason"] and first["work_left"]
    assert first["final_eval_return"] is None        # preempted: the checkpoint alone
    with h5py.File(first["checkpoint"], "r") as f:
        saved = f.attrs["params_digest"]
        assert f.attrs["updates"] == first["updates"] > 20

    more = first["env_steps"] + 2000
    proc = launch(3, run_dir, "--resume", "latest", "--total-steps", str(more),
                  "--eval-every", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    second = summary(run_dir)
    assert second["resumed_from"] == first["checkpoint"]
    assert second["params_digest_at_start"] == saved           # bit-identical restore
    assert second["updates"] > first["updates"] and second["env_steps"] >= more
    assert second["exit_status"] == 0 and second["final_eval_return"] is not None
    steps = read_run_metrics(run_dir)["learner"]["env_step"]
    assert (np.diff(steps) >= 0).all() and steps.max() > first["env_steps"]


@pytest.mark.mpi
def test_checkpoints_while_training(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(3, run_dir, "--total-steps", "150000", "--eval-every", "0",
                  "--checkpoint-every", "0.3", "--keep-checkpoints", "10",
                  "--master-envs", "0")            # the workers step: they checkpoint too
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = summary(run_dir)
    files = sorted((run_dir / "checkpoints").glob("step_*.h5"))
    assert len(files) >= 3 and str(files[-1]) == s["checkpoint"]
    steps = [int(f.stem.split("_")[1]) for f in files]
    assert steps[0] < steps[-1] == s["updates"]         # mid-run ones, then the final one


@pytest.mark.mpi
@pytest.mark.parametrize("share", ["0", "all"])
def test_a_failing_master_ends_the_job(tmp_path, share):
    """With workers stepping (0) and with them idle in their barrier (all)."""
    env = mpi_env(PAL_HPC_INJECT_FAULT="0:0.5")
    t0 = time.monotonic()
    proc = subprocess.run(pal_main(3, *FAST, "--run-dir", str(tmp_path / "run"),
                                   "--total-steps", "100000000", "--master-envs", share),
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode != 0
    assert "injected fault on rank 0" in proc.stderr
    assert time.monotonic() - t0 < 60                  # the workers did not hang the job


@pytest.mark.mpi
@pytest.mark.parametrize("flags, message", [
    (["--num-envs", "16", "--master-envs", "0"],
     "num_envs: 16 environments cannot be shared evenly by 3 worker"),
    (["--env", "Pendulum-v1"], "env: paac needs a Discrete action space; Pendulum-v1 has Box"),
    (["--learners-per-node", "2"], "learners_per_node: --algo paac runs one master per node"),
    (["--async-update", "--no-overlap"], "async_update: needs --overlap"),
])
def test_bad_flags_are_refused_before_work(tmp_path, flags, message):
    proc = launch(4, tmp_path / "run", *flags, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert not (tmp_path / "run" / "metrics.h5").exists()


@pytest.mark.slow
@pytest.mark.mpi
def test_cartpole_reaches_475(tmp_path):
    """The issue's acceptance run for one seed (the defaults, -n 4)."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(pal_main(4, "--algo", "paac", "--target-return", "475",
                                   "--total-steps", "500000", "--seed", "1",
                                   "--run-dir", str(run_dir)),
                          cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary(run_dir)["time_to_target_s"] is not None
