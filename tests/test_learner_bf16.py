"""`--precision bf16` for the off-policy learners (DQN, DDPG, TD3, SAC): autocast for the
forward and backward passes, fp32 parameters, gradients and optimizer.  Each phase's
bf16 gradient points where the fp32 one does (cosine > 0.98), the gradient buffer
stays float32, and a bad precision is a config error naming the field."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from pal_hpc.algos.ddpg import DDPG, DDPGConfig
from pal_hpc.algos.dqn import DQN, DQNConfig
from pal_hpc.algos.sac import SAC, SACConfig
from pal_hpc.algos.td3 import TD3, TD3Config
from pal_hpc.config import ConfigError

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
FRAMES = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
ALGOS = {"dqn": (DQN, DQNConfig), "ddpg": (DDPG, DDPGConfig), "td3": (TD3, TD3Config),
         "sac": (SAC, SACConfig)}


def build(name: str, precision: str, image: bool = False):
    Algo, Config = ALGOS[name]
    if name == "dqn":
        return Algo(FRAMES if image else OBS, gym.spaces.Discrete(4),
                    Config(hidden=[64, 64], precision=precision), seed=1)
    return Algo(OBS, ACT, Config(hidden=[64, 64], precision=precision), seed=1)


def batch_for(name: str, b: int, image: bool = False) -> dict:
    rng = np.random.default_rng(0)
    shape = FRAMES.shape if image else OBS.shape
    obs = (rng.integers(0, 256, (2, b, *shape), dtype=np.uint8) if image
           else rng.standard_normal((2, b, *shape)).astype(np.float32))
    action = (rng.integers(0, 4, b) if name == "dqn"
              else rng.uniform(-1, 1, (b, 2)).astype(np.float32))
    return {"obs": obs[0], "next_obs": obs[1], "action": action,
            "reward": rng.standard_normal(b).astype(np.float32),
            "discount": np.full(b, 0.99, np.float32),
            "weights": rng.uniform(0.2, 1.0, b).astype(np.float32)}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("name", list(ALGOS))
def test_bf16_gradients_point_where_fp32_ones_do(name):
    fp32, bf16 = build(name, "fp32"), build(name, "bf16")
    batch = batch_for(name, 128)
    for u in range(2):                                   # TD3's delayed actor on u = 1
        for phase in fp32.phases(u):
            g32 = np.zeros(fp32.phase_size(phase), np.float32)
            g16 = np.zeros_like(g32)
            m32, p32 = fp32.compute_gradients(phase, batch, g32, metrics=True)
            m16, p16 = bf16.compute_gradients(phase, batch, g16, metrics=True)
            assert set(m16) == set(m32) and all(np.isfinite(v) for v in m16.values())
            assert np.linalg.norm(g32) > 0 and np.isfinite(g16).all()
            assert cosine(g32, g16) > 0.98, (name, phase, cosine(g32, g16))
            assert not np.array_equal(g32, g16)          # bf16 did run
            assert (p32 is None) == (p16 is None)
            if p16 is not None:
                assert p16.dtype == np.float64 and np.corrcoef(p32, p16)[0, 1] > 0.98
            # Both apply the fp32 gradient: the next phase compares like with like.
            fp32.apply_gradients(phase, g32)
            bf16.apply_gradients(phase, g32)
    assert all(a.dtype == np.float32 for a in bf16.state_arrays())


def test_bf16_dqn_nature_cnn_gradient():
    fp32, bf16 = build("dqn", "fp32", image=True), build("dqn", "bf16", image=True)
    batch = batch_for("dqn", 16, image=True)
    g32 = np.zeros(fp32.num_params, np.float32)
    g16 = np.zeros_like(g32)
    fp32.compute_gradients("q", batch, g32)
    bf16.compute_gradients("q", batch, g16)
    assert cosine(g32, g16) > 0.98 and not np.array_equal(g32, g16)


@pytest.mark.parametrize("name", list(ALGOS))
def test_bad_precision_names_the_field(name):
    with pytest.raises(ConfigError, match="precision"):
        ALGOS[name][1](precision="fp16").validate()


def test_bf16_outputs_keep_fp32_resolution_at_large_values():
    """The last layer runs in fp32 under bf16 (nets.output_linear): Q-values near -500
    (TD3 on Pendulum) keep their fractional part, where bf16 would round them to a
    multiple of 2, and Pong-sized Q-values (about -1.3) keep the greedy action."""
    import torch

    rng = np.random.default_rng(3)
    obs = torch.as_tensor(rng.standard_normal((256, 3)).astype(np.float32))
    act = torch.as_tensor(rng.uniform(-1, 1, (256, 2)).astype(np.float32))
    td3 = build("td3", "bf16")
    critic = td3.critics[0]
    with torch.no_grad():
        critic.mlp.layers[-1].bias.fill_(-500.0)
        q32 = critic(obs, act)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            q16 = critic(obs, act)
    assert q16.dtype == torch.float32
    assert (q16 - q32).abs().max() < 0.1                    # bf16 output: up to 1
    assert len(torch.unique(q16)) > 200                      # not on a grid of 2s

    dqn = DQN(FRAMES, gym.spaces.Discrete(6), DQNConfig(dueling=True, precision="bf16"),
              seed=1)
    frames = torch.as_tensor(rng.integers(0, 256, (64, *FRAMES.shape), dtype=np.uint8))
    with torch.no_grad():
        dqn.online.value.bias.fill_(-1.3)
        dqn.online.advantage.weight.mul_(0.05)              # small action gaps
        q32 = dqn.online(frames)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            q16 = dqn.online(frames)
    assert q16.dtype == torch.float32
    gaps = q32.sort(dim=1).values
    assert (gaps[:, -1] - gaps[:, -2]).median() < 0.0078     # finer than bf16 near -1.3
    assert (q16 - q32).abs().max() < 0.0039
    assert (q16.argmax(1) == q32.argmax(1)).float().mean() >= 0.95


def test_bf16_on_a_cpu_without_native_bf16_is_warned_about(monkeypatch):
    """bf16 emulated in fp32 (no AVX512-BF16) is several times slower than fp32: the
    note names the flag's way out; it stays silent for fp32, a GPU, or a bf16 CPU."""
    from pal_hpc.algos import nets

    monkeypatch.setattr(nets, "cpu_has_bf16", lambda: False)
    note = nets.bf16_cpu_note("bf16", "cpu")
    assert note is not None and "--precision fp32" in note and "AVX512-BF16" in note
    assert nets.bf16_cpu_note("fp32", "cpu") is None
    assert nets.bf16_cpu_note("bf16", "cuda") is None
    monkeypatch.setattr(nets, "cpu_has_bf16", lambda: True)
    assert nets.bf16_cpu_note("bf16", "cpu") is None


def test_the_bf16_note_reaches_the_start_up_output(tmp_path):
    """The real entry point prints the note exactly when this CPU lacks native bf16."""
    import subprocess

    from conftest import mpi_env, pal_cmd
    from pal_hpc.algos.nets import cpu_has_bf16

    proc = subprocess.run(pal_cmd(1, tmp_path / "run", "--algo", "dqn", "--env", "CartPole-v1",
                                  "--precision", "bf16", "--total-steps", "600"),
                          env=mpi_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ("without native bfloat16" in proc.stdout) == (not cpu_has_bf16()), proc.stdout
