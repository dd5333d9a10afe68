"""PPO: GAE and the clipped loss against hand-computed cases, a minibatch split over two
masters against one master on the union, the normalizers' merge, exact state round
trips, the Gaussian's log-probabilities, the per-family defaults and presets, and the
on-policy runtime through the real entry point (1 rank; 2 virtual nodes with
continuous actions and normalization; resume; the merge under mpiexec on 1 and 3
ranks)."""

from __future__ import annotations

import json
import math
import subprocess
import textwrap

import gymnasium as gym
import h5py
import numpy as np
import pytest
import torch

from conftest import ROOT, mpi_env, run_mpi
from pal_hpc.algos import ALGOS, PPO
from pal_hpc.algos.ppo import PPOConfig, RunningMoments, gae, moments, ppo_loss
from pal_hpc.algos.ppo.loss import SUMS
from pal_hpc.algos.ppo.network import sample
from pal_hpc.cluster.launch import pal_main
from pal_hpc.config import ConfigError
from pal_hpc.config_io import load_config
from pal_hpc.io import checkpoint as ckpt
from pal_hpc.io.metrics import read_run_metrics

OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
DISCRETE = gym.spaces.Discrete(2)
SUMS_KL = SUMS.index("approx_kl")
BOX = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def make(act=DISCRETE, seed=0, **fields) -> PPO:
    cfg = PPOConfig(**{"hidden": [16], "num_steps": 6, "num_minibatches": 3,
                       "update_epochs": 2, **fields})
    return PPO(OBS, act, cfg, seed=seed, gamma=0.9)


def rollout(algo: PPO, n=4, t_max=6, seed=0, ends=((1, 0, "term"), (3, 2, "trunc"))):
    """A round acted by `algo`'s policy on random observations; `ends` lists
    (t, env, kind) episode ends, each followed by its reset step."""
    rng = np.random.default_rng(seed)
    obs = (rng.normal(size=(t_max + 1, n, 3)) * 3 + 1).astype(np.float32)
    spec = algo.action_spec()
    b = {"obs": obs, "action": np.zeros((t_max, n, *spec[0]), spec[1]),
         "logprob": np.zeros((t_max, n), np.float32), "value": np.zeros((t_max, n), np.float32),
         "reward": rng.normal(size=(t_max, n)).astype(np.float32),
         "terminated": np.zeros((t_max, n), bool), "truncated": np.zeros((t_max, n), bool),
         "valid": np.ones((t_max, n), bool)}
    for t, i, kind in ends:
        b["terminated" if kind == "term" else "truncated"][t, i] = True
        if t + 1 < t_max:
            b["valid"][t + 1, i] = False
    for t in range(t_max):
        a, extra = algo.rollout_act(obs[t], rng)
        b["action"][t], b["logprob"][t], b["value"][t] = a, extra["logprob"], extra["value"]
    return b


def envs_of(batch, lo, hi):
    return {k: v[:, lo:hi].copy() for k, v in batch.items()}


def drive(algos, batches):
    """One round's update on `algos` as masters: the runtime's gather, then each step's
    gradients and sums summed (the Allreduce) and applied on every master."""
    parts = [a.begin_update(b) for a, b in zip(algos, batches)]
    plans = [a.update_plan(b, parts, m) for m, (a, b) in enumerate(zip(algos, batches))]
    n, steps = algos[0].num_params, 0
    while True:
        step = [next(p, None) for p in plans]
        if all(s is None for s in step):
            return steps
        assert all(s is not None for s in step)
        grads, sums = [], []
        for a, s in zip(algos, step):
            out = np.zeros(n, np.float32)
            a.compute_gradients("ppo", s, out)
            grads.append(out)
            sums.append(a.step_sums().copy())
        g, s = sum(grads), sum(sums)
        for a in algos:
            a.apply_gradients("ppo", g, scale=a.grad_scale(len(algos)))
            a.after_step(s)
        steps += 1


# ---- the maths by hand ------------------------------------------------------------------

def test_gae_cuts_at_termination_bootstraps_truncation_and_the_round_end():
    g, lam = 0.5, 0.5
    # env 0 terminates at t=0 (t=1 is its reset step); env 1 is truncated at t=1.
    r = np.array([[1.0, 1.0], [0.0, 2.0], [3.0, 0.0]])
    v = np.array([[0.5, 0.5], [9.0, 4.0], [1.0, 6.0], [2.0, 8.0]])   # V(s_0..s_3)
    term = np.array([[True, False], [False, False], [False, False]])
    trunc = np.array([[False, False], [False, True], [False, False]])
    adv, ret = gae(r, v, term, trunc, g, lam)
    # env 0: t=2 bootstraps V(s_3) = 2; t=0 ends the episode: delta only, no V(s_1).
    d2 = 3 + g * 2 - 1
    assert adv[2, 0] == pytest.approx(d2)
    assert adv[0, 0] == pytest.approx(1 - 0.5)
    # env 1: t=1 truncated -> bootstrap V(s_2) = 6 (the episode's last obs), no A_2.
    d1 = 2 + g * 6 - 4
    d0 = 1 + g * 4 - 0.5
    assert adv[1, 1] == pytest.approx(d1)
    assert adv[0, 1] == pytest.approx(d0 + g * lam * d1)
    assert adv[2, 1] == pytest.approx(0 + g * 8 - 6)
    np.testing.assert_allclose(ret, adv + v[:3])


def test_clipped_loss_by_hand():
    t = lambda *x: torch.tensor(x, dtype=torch.float64)    # noqa: E731
    old = t(0.0, 0.0, 0.0)
    logp = t(math.log(1.5), math.log(0.5), math.log(1.1))   # ratios 1.5, 0.5, 1.1
    adv, ret = t(1.0, 1.0, -2.0), t(1.0, 0.0, 0.0)
    value, old_v = t(2.0, 0.05, -1.0), t(0.0, 0.0, 0.0)
    ent = t(0.3, 0.2, 0.1)
    loss, sums = ppo_loss(logp, ent, value, old, adv, ret, old_v, 4, clip_coef=0.2,
                          clip_vloss=True, ent_coef=0.01, vf_coef=0.5)
    # pg: max(-A r, -A clip(r)): -1.2, -0.5, 2.2 (row 3: r=1.1 unclipped, -(-2)(1.1))
    pg = -1.2 + -0.5 + 2.2
    # v: max((V-R)^2, (clip(V - Vold) + Vold - R)^2): max(1, 0.64), max(.0025, .0025), max(1, .04)
    v = 0.5 * (1.0 + 0.0025 + 1.0)
    assert sums[0].item() == pytest.approx(pg, rel=1e-6)
    assert sums[1].item() == pytest.approx(v, rel=1e-6)
    assert loss.item() == pytest.approx((pg - 0.01 * 0.6 + 0.5 * v) / 4, rel=1e-6)
    r = np.array([1.5, 0.5, 1.1])
    kl = ((r - 1) - np.log(r)).sum()
    assert sums[3].item() == pytest.approx(kl, rel=1e-5)
    assert sums[5].item() == 2                      # |r - 1| > 0.2 twice
    _, plain = ppo_loss(logp, ent, value, old, adv, ret, old_v, 4, clip_coef=0.2,
                        clip_vloss=False, ent_coef=0.0, vf_coef=0.5)
    assert plain[1].item() == pytest.approx(0.5 * (1.0 + 0.0025 + 1.0), rel=1e-6)


def test_gaussian_log_probs_and_entropy_are_torchs_normal():
    algo = make(BOX, log_std_init=-0.5)
    obs = np.random.default_rng(1).normal(size=(5, 3)).astype(np.float32)
    actions, extra = algo.rollout_act(obs, np.random.default_rng(2))
    mean, _ = algo.net(torch.as_tensor(obs))
    dist = torch.distributions.Normal(mean, algo.net.log_std.exp())
    lp, ent, _ = algo.net.evaluate(torch.as_tensor(obs), torch.as_tensor(actions))
    torch.testing.assert_close(lp, dist.log_prob(torch.as_tensor(actions)).sum(-1))
    torch.testing.assert_close(ent, dist.entropy().sum(-1))
    np.testing.assert_allclose(extra["logprob"], lp.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert np.abs(algo.env_actions(actions * 10)).max() <= 1.0      # clipped for the env


@pytest.mark.parametrize("act", [DISCRETE, BOX])
def test_numpy_acting_follows_torch(act):
    for shared in (False, True):
        algo = make(act, shared_torso=shared, norm_obs=True)
        algo.obs_norm.merge(moments(np.random.default_rng(3).normal(size=(50, 3)) * 4))
        obs = np.random.default_rng(4).normal(size=(7, 3)).astype(np.float32)
        out, value = algo._np(algo.obs_norm.normalize(obs, 10.0))
        with torch.no_grad():
            t_out, t_value = algo.net(algo._obs(obs))
        np.testing.assert_allclose(out, t_out.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(value, t_value.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act", [DISCRETE, BOX])
@pytest.mark.parametrize("clip_vloss", [True, False])
def test_numpy_gradient_is_autograds(act, clip_vloss):
    """Small separate MLPs learn through numpy_grad: its gradient and sums are torch
    autograd's, with ratios and values far enough from the old ones to clip."""
    algos = [make(act, seed=2, clip_vloss=clip_vloss, ent_coef=0.05, norm_obs=True,
                  activation=f) for f in ("tanh", "tanh", "relu", "relu")]
    for k in (1, 3):
        algos[k]._npgrad = None                     # the torch path
    assert algos[0]._npgrad is not None and make(act, shared_torso=True)._npgrad is None
    rng = np.random.default_rng(8)
    batch = rollout(algos[0])
    batch["logprob"] += rng.normal(scale=0.3, size=batch["logprob"].shape).astype(np.float32)
    batch["value"] += rng.normal(scale=0.5, size=batch["value"].shape).astype(np.float32)
    for fast, slow in (algos[:2], algos[2:]):
        got = []
        for a in (fast, slow):
            a.obs_norm.merge(moments(batch["obs"][0]))
            plan = a.update_plan(batch, [a.begin_update(batch)], 0)
            out = np.zeros(a.num_params, np.float32)
            a.compute_gradients("ppo", next(plan), out)
            got.append((out, a.step_sums().copy()))
        np.testing.assert_allclose(got[0][0], got[1][0], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(got[0][1], got[1][1], rtol=1e-4, atol=1e-5)
        assert got[0][1][5] > 0                      # some ratios were clipped


def test_categorical_sampling_log_probs():
    logits = np.random.default_rng(5).normal(size=(40, 3)).astype(np.float32)
    a, lp = sample(logits, None, np.random.default_rng(6))
    want = torch.log_softmax(torch.as_tensor(logits), -1)[torch.arange(40), torch.as_tensor(a)]
    np.testing.assert_allclose(lp, want.numpy(), rtol=1e-5, atol=1e-6)


# ---- masters ------------------------------------------------------------------------------

def test_moments_merge_is_the_unions():
    rng = np.random.default_rng(7)
    parts = [rng.normal(size=(k, 3)) * 2 + 5 for k in (10, 1, 33)]
    split, union = RunningMoments((3,)), RunningMoments((3,))
    for p in parts:
        split.merge(moments(p))
    union.merge(moments(np.concatenate(parts)))
    np.testing.assert_allclose(split.mean, union.mean, rtol=1e-12)
    np.testing.assert_allclose(split.var, union.var, rtol=1e-12)
    every = np.concatenate(parts)
    np.testing.assert_allclose(union.mean, every.mean(0), rtol=1e-5)   # the 1e-4 prior
    np.testing.assert_allclose(union.var, every.var(0), rtol=1e-4)


@pytest.mark.parametrize("act", [DISCRETE, BOX])
@pytest.mark.parametrize("shared", [False, True])        # numpy_grad, torch
def test_a_minibatch_split_over_two_masters_is_one_master_on_the_union(act, shared):
    fields = {"norm_obs": True, "norm_reward": True, "shared_torso": shared}
    union = make(act, seed=3, **fields)
    halves = [make(act, seed=3, **fields) for _ in range(2)]
    for round_ in range(2):
        batch = rollout(union, seed=round_)
        for a in halves:                  # begin with what the union holds
            a.set_flat_params(union.policy_params())
        assert drive([union], [batch]) == drive(halves, [envs_of(batch, 0, 2),
                                                         envs_of(batch, 2, 4)]) == 6
        np.testing.assert_allclose(halves[0].policy_params(), union.policy_params(),
                                   rtol=1e-4, atol=1e-6)
        assert halves[0].digest() == halves[1].digest()      # the masters agree exactly
        for a in halves:
            np.testing.assert_allclose(a.obs_norm.mean, union.obs_norm.mean, rtol=1e-10)
            np.testing.assert_allclose(a.ret_norm.var, union.ret_norm.var, rtol=1e-10)
    assert union.updates == 2


def test_target_kl_ends_the_epochs_and_metrics():
    algo = make(update_epochs=5, target_kl=1e-9, lr=1e-2, lr_anneal=False)
    drive([algo], [rollout(algo)])
    m = algo.round_metrics({})
    assert set(m) == set(PPO.metric_names)
    assert m["epochs"] == 1 and m["approx_kl"] > 1e-9
    free = make(update_epochs=5, lr=1e-2)
    assert drive([free], [rollout(free)]) == 15
    assert free.round_metrics({})["epochs"] == 5 and -1 < free.round_metrics({})["clipfrac"] <= 1


def test_state_round_trip_through_hdf5_continues_identically(tmp_path):
    a = make(BOX, seed=4, norm_obs=True, norm_reward=True)
    drive([a], [rollout(a, seed=1)])
    a.set_progress(0.4)
    path = tmp_path / "s.h5"
    with h5py.File(path, "w") as f:
        ckpt.save_tree(f.create_group("algo"), a.state_dict())
    b = make(BOX, seed=99, norm_obs=True, norm_reward=True)
    with h5py.File(path, "r") as f:
        b.load_state_dict(ckpt.load_tree(f["algo"]))
    assert b.digest() == a.digest() and b.updates == 1
    a._ret_carry = None                   # resumed envs start new episodes
    batch = rollout(a, seed=2)
    for x in (a, b):
        x.set_progress(0.6)
        drive([x], [batch])
    assert b.digest() == a.digest() and a.learning_rate() == b.learning_rate()


def test_learning_rate_anneals_from_the_rounds_before():
    a = make(lr=1e-3)
    a.set_progress(0.25)                  # the first round: the full rate
    assert a.learning_rate() == 1e-3
    a.set_progress(0.5)
    assert a.learning_rate() == pytest.approx(0.75e-3)
    z = make(lr=1e-3, clip_anneal=True, clip_coef=0.2)
    z.set_progress(0.5)
    z.set_progress(1.0)
    assert z.clip_coef() == pytest.approx(0.1)


def test_orthogonal_init_and_separate_torsos():
    a = make(seed=1)
    w = a.net.policy.weight.detach().double()
    torch.testing.assert_close(w @ w.T, 1e-4 * torch.eye(2, dtype=torch.float64))
    assert a.net.value_trunk is not None and not a.net.value.bias.any()
    shared = make(seed=1, shared_torso=True)
    assert shared.net.value_trunk is None and shared.num_params < a.num_params
    frames = PPO(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6),
                 PPOConfig(shared_torso=True), seed=0)
    assert frames.net.trunk.kind == "nature" and frames._np is None and frames.clip_rewards


def test_bf16_acts_and_learns_where_fp32_does():
    """--precision bf16: the torso under autocast, the heads, log-probabilities, losses,
    gradients and Adam in fp32; a round's first gradient points where fp32's does, the
    acting log-probabilities are what the update recomputes (ratio 1 to bf16's
    rounding), and MLPs leave the numpy paths (they are fp32 only)."""
    frames = gym.spaces.Box(0, 255, (4, 10, 10), np.uint8)
    rng = np.random.default_rng(5)
    obs = rng.integers(0, 256, (7, 4, *frames.shape), dtype=np.uint8)
    reward = rng.normal(size=(6, 4)).astype(np.float32)
    algos = {p: PPO(frames, gym.spaces.Discrete(3),
                    PPOConfig(cnn="minatar", shared_torso=True, precision=p, num_steps=6,
                              num_minibatches=1, update_epochs=1), seed=2)
             for p in ("fp32", "bf16")}
    grads = {}
    for p, algo in algos.items():
        acts = [algo.rollout_act(obs[t], np.random.default_rng(t)) for t in range(6)]
        batch = {"obs": obs, "action": np.stack([a for a, _ in acts]),
                 "logprob": np.stack([x["logprob"] for _, x in acts]),
                 "value": np.stack([x["value"] for _, x in acts]),
                 "reward": reward, "terminated": np.zeros((6, 4), bool),
                 "truncated": np.zeros((6, 4), bool), "valid": np.ones((6, 4), bool)}
        assert batch["logprob"].dtype == batch["value"].dtype == np.float32
        parts = [algo.begin_update(batch)]
        step = next(iter(algo.update_plan(batch, parts, 0)))
        grads[p] = np.zeros(algo.num_params, np.float32)
        algo.compute_gradients("ppo", step, grads[p])
        sums = algo.step_sums() / step["size"]
        assert np.isfinite(grads[p]).all() and np.isfinite(sums).all()
        assert abs(sums[SUMS_KL]) < 1e-3, (p, sums)          # r = 1 on the first step
    g32, g16 = grads["fp32"], grads["bf16"]
    assert not np.array_equal(g32, g16)                      # bf16 did run
    assert g32 @ g16 / (np.linalg.norm(g32) * np.linalg.norm(g16)) > 0.98
    mlp = make(precision="bf16")
    assert mlp._np is None and mlp._npgrad is None
    assert make()._np is not None and make()._npgrad is not None
    with pytest.raises(ConfigError, match="precision"):
        PPOConfig(precision="fp16").validate()



@pytest.mark.parametrize("torso", ["minatar-shared", "minatar-separate", "mlp"])
def test_bf16_acting_copy_is_autocast_bit_for_bit_after_every_kind_of_write(torso):
    """bf16 acting runs a bf16 copy of the torsos (nets.Bf16Acting), not autocast's
    per-call casts: its logits and values equal autocast's forward bit for bit, at the
    start and after each write to the parameters (an optimizer step, set_flat_params,
    load_state_dict: each says so)."""
    if torso == "mlp":
        space, act = OBS, DISCRETE
        obs = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
        cfg = PPOConfig(hidden=[16], precision="bf16")
    else:
        space, act = gym.spaces.Box(0, 255, (4, 10, 10), np.uint8), gym.spaces.Discrete(3)
        obs = np.random.default_rng(0).integers(0, 256, (5, *space.shape), dtype=np.uint8)
        cfg = PPOConfig(cnn="minatar", precision="bf16",
                        shared_torso=torso == "minatar-shared")
    algo, other = PPO(space, act, cfg, seed=1), PPO(space, act, cfg, seed=7)

    def check():
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            want = algo.net(algo._obs(obs))
        got = algo._heads(obs)
        for w, g in zip(want, got):
            assert np.array_equal(w.numpy(), g)

    check()
    rng = np.random.default_rng(3)
    algo.apply_gradients("ppo", rng.normal(size=algo.num_params).astype(np.float32))
    check()
    algo.set_flat_params(other.get_flat_params())
    check()
    algo.apply_gradients("ppo", rng.normal(size=algo.num_params).astype(np.float32))
    algo.load_state_dict(other.state_dict())
    check()


# ---- configuration ------------------------------------------------------------------------

def test_defaults_per_family_and_the_zoo_preset():
    acfg = load_config(["--algo", "ppo"]).algo_config                    # ppo.py
    assert (acfg.num_envs, acfg.num_steps, acfg.num_minibatches, acfg.update_epochs,
            acfg.lr, acfg.ent_coef, acfg.clip_vloss) == (4, 128, 4, 4, 2.5e-4, 0.01, True)
    cont = load_config(["--algo", "ppo", "--env", "Pendulum-v1"]).algo_config
    assert (cont.num_envs, cont.num_steps, cont.num_minibatches, cont.update_epochs,
            cont.lr, cont.ent_coef, cont.norm_obs, cont.norm_reward) == \
        (1, 2048, 32, 10, 3e-4, 0.0, True, True)
    zoo = load_config(["--algo", "ppo", "--ppo-preset", "zoo", "--update-epochs", "3"])
    z = zoo.algo_config
    assert zoo.gamma == 0.98 and (z.num_envs, z.num_steps, z.gae_lambda, z.lr) == \
        (8, 32, 0.8, 1e-3)
    assert z.clip_anneal and not z.clip_vloss and z.vf_coef == 1.0
    assert z.update_epochs == 3                                     # the flag wins
    assert load_config(["--algo", "ppo", "--ppo-preset", "zoo", "--gamma", "0.9"]).gamma == 0.9
    for field, value in (("num_minibatches", 0), ("gae_lambda", 1.5), ("target_kl", 0.0),
                         ("clip_coef", 0.0), ("init", "xavier")):
        with pytest.raises(ConfigError, match=f"^{field}: "):
            PPOConfig(**{field: value}).validate()
    assert ALGOS["ppo"] is PPO and PPO.on_policy
    with pytest.raises(ConfigError, match="ppo needs a Discrete or Box"):
        PPO.check_env("x", OBS, gym.spaces.MultiBinary(3))


# ---- through the entry point ----------------------------------------------------------------

FAST = ["--algo", "ppo", "--eval-episodes", "2", "--progress-every", "0.5", "--hidden", "16"]


def launch(n, run_dir, *flags, timeout=120):
    return subprocess.run(pal_main(n, *FAST, "--run-dir", str(run_dir), *flags), cwd=ROOT,
                          env=mpi_env(), capture_output=True, text=True, timeout=timeout)


def summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def digest_of(path):
    with h5py.File(path, "r") as f:
        return f.attrs["params_digest"]


@pytest.mark.mpi
def test_cartpole_trains_logs_and_resumes_exactly(tmp_path):
    """-n 1: CleanRL's metrics in the HDF5 log and TensorBoard every round; a resume
    restores the checkpoint bit for bit, and two resumes from it end alike."""
    run = tmp_path / "run"
    proc = launch(1, run, "--total-steps", "3000", "--eval-every", "1500", "--num-steps", "64",
                  "--tensorboard")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = summary(run)
    assert s["algo"] == "ppo" and s["updates"] == -(-3000 // 256) and s["exit_status"] == 0
    log = read_run_metrics(run)
    assert log["learner"].dtype.names[3:] == PPO.metric_names
    assert len(log["learner"]) == s["updates"]
    from test_tensorboard import scalars
    tb = scalars(run / "tensorboard")
    for name in ("approx_kl", "clipfrac", "explained_variance", "entropy", "value_loss"):
        assert len(tb[f"learner/{name}"]) == s["updates"], sorted(tb)
    assert (log["learner"]["epochs"] == 4).all() and np.isfinite(log["learner"]["approx_kl"]).all()
    assert len(log["evaluation"]) >= 2 and len(log["episodes"]) == s["episodes"]
    saved = tmp_path / "saved.h5"
    saved.write_bytes(open(s["checkpoint"], "rb").read())
    ends = []
    for k in range(2):
        again = tmp_path / f"again{k}"
        again.mkdir()
        proc = launch(1, again, "--resume", str(saved), "--total-steps", "5000",
                      "--eval-every", "0", "--num-steps", "64")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        s2 = summary(again)
        assert s2["params_digest_at_start"] == digest_of(saved)        # exact restore
        assert s2["updates"] == -(-5000 // 256)
        ends.append(digest_of(s2["checkpoint"]))
    assert ends[0] == ends[1]


@pytest.mark.mpi
def test_two_virtual_nodes_continuous_with_normalization(tmp_path):
    """-n 4, 2 nodes of a master and a worker: Gaussian actions on Pendulum with obs
    and reward normalization merged across the masters; the masters stay identical and
    the same seed gives the same parameters bit for bit."""
    digests = []
    for k in range(2):
        run = tmp_path / f"run{k}"
        proc = launch(4, run, "--env", "Pendulum-v1", "--ranks-per-node", "2",
                      "--num-envs", "2", "--master-envs", "0", "--num-steps", "100",
                      "--num-minibatches", "4", "--update-epochs", "2",
                      "--total-steps", "2000", "--eval-every", "0", timeout=180)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        s = summary(run)
        assert s["masters"] == 2 and s["num_envs"] == [2, 2] and s["updates"] == 5
        assert s["learner_params_identical"]
        with h5py.File(s["checkpoint"], "r") as f:
            digests.append(f.attrs["params_digest"])
            norm = ckpt.load_tree(f["algo"])["obs_norm"]
            assert norm["count"] == pytest.approx(1e-4 + 2000, abs=1)   # both nodes' obs
    assert digests[0] == digests[1]


MERGE = textwrap.dedent('''
    """Each rank a master with its own data: the runtime's update (MasterUpdates)
    merges the normalization moments and steps the same parameters on every rank."""
    import sys, time
    import numpy as np
    from mpi4py import MPI
    sys.path.insert(0, "tests")
    from test_ppo import make, rollout, BOX
    from pal_hpc.algos.ppo import RunningMoments, moments
    from pal_hpc.runtime.onpolicy.update import MasterUpdates
    from pal_hpc.runtime.onpolicy.rollout import Rollout

    class Master(MasterUpdates):
        def __init__(self, algo):
            self.algo, self.algo_class = algo, type(algo)
            self.masters = self.world = MPI.COMM_WORLD
            self.times = {"update": 0.0, "allreduce_wait": 0.0}
            self.coord, self.start, self.rows = None, time.monotonic(), []
            self.telemetry = self
            self._update_buffers()
        def record(self, stream, row): self.rows.append(row)
        def _global_steps(self): return 0

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    algo = make(BOX, seed=5, norm_obs=True, norm_reward=True)
    batch = rollout(algo, n=3 + rank, seed=10 + rank)        # unequal shares
    ro = Rollout(6, 3 + rank, (3,), np.float32, (2,), np.float32,
                 algo.rollout_fields())
    for k, v in batch.items():
        (ro.extras if k in ro.extras else ro.__dict__)[k][...] = v
    master = Master(algo)
    votes = master._update(ro)
    every = comm.allgather(batch["obs"][1:].reshape(-1, 3))
    want = RunningMoments((3,))
    want.merge(moments(np.concatenate(every)))
    ok = (np.allclose(algo.obs_norm.mean, want.mean, rtol=1e-10)
          and np.allclose(algo.obs_norm.var, want.var, rtol=1e-10)
          and algo.updates == 1 and votes == (False, False, False)
          and len(set(comm.allgather(algo.digest()))) == 1
          and (rank != 0 or len(master.rows) == 1))
    ok = comm.allreduce(ok, op=MPI.LAND)
    if rank == 0:
        print("MERGE", "ok" if ok else "FAILED", size)
    ''')


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 3])
def test_normalization_merges_across_masters_under_mpiexec(tmp_path, n):
    script = tmp_path / "merge.py"
    script.write_text(MERGE)
    proc = run_mpi(n, script, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"MERGE ok {n}" in proc.stdout, proc.stdout + proc.stderr
