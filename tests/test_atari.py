"""The Atari pipeline on real ale-py games (the ROMs ship with ale-py): make_env's
preprocessing (gymnasium's own wrappers) checked against frames grabbed from an
unpreprocessed emulator, the CNN torsos, DQN on frames, and a run of the real entry
point on ALE/Pong-v5."""

import dataclasses
import json
import subprocess

import cv2
import gymnasium as gym
import numpy as np
import pytest
import torch

from conftest import ROOT, mpi_env, pal_cmd
from pal_hpc.algos import DQN
from pal_hpc.algos.cnn import CNNTorso, nature_cnn, nips_cnn
from pal_hpc.algos.dqn import DQNConfig
from pal_hpc.algos.nets import MLPTorso, is_image, seeded, torso
from pal_hpc.cluster.weights import WeightStore
from pal_hpc.config import Config, ConfigError
from pal_hpc.config_io import load_config
from pal_hpc.envs import is_atari, make_env, obs_info
from pal_hpc.replay import SharedReplay
from pal_hpc.runtime.actor import Actor
from pal_hpc.runtime.nstep import transition_spec

PONG, BREAKOUT = "ALE/Pong-v5", "ALE/Breakout-v5"
FRAMES = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
NOOP, FIRE = 0, 1


def grey84(screen: np.ndarray) -> np.ndarray:
    """An emulator screen as the preprocessing resizes it (84x84, area interpolation)."""
    return cv2.resize(screen, (84, 84), interpolation=cv2.INTER_AREA)


# ---- the environment ---------------------------------------------------------------------

@pytest.mark.parametrize("env_id", [PONG, BREAKOUT])
def test_observations_are_four_stacked_84x84_uint8_frames(env_id):
    env = make_env(env_id, 0)
    assert env.observation_space == FRAMES
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        assert obs.dtype == np.uint8 and obs.shape == (4, 84, 84) and obs in FRAMES
        obs, *_ = env.step(env.action_space.sample())
    # gymnasium's wrappers over a frameskip=1 game that keeps v5's sticky actions.
    assert isinstance(env, gym.wrappers.FrameStackObservation)
    assert isinstance(env.env, gym.wrappers.AtariPreprocessing)
    assert env.unwrapped._frameskip == 1
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
    # The replay stores what the env gives: uint8 frames.
    assert obs_info(env) == ((4, 84, 84), np.dtype(np.uint8))
    env.close()


def test_each_step_runs_four_emulator_frames():
    env = make_env(PONG, 5)
    _, info = env.reset(seed=5)
    start = info["episode_frame_number"]
    ale = env.unwrapped.ale
    assert ale.getEpisodeFrameNumber() == start
    for k in range(1, 11):
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        assert not (terminated or truncated)
        assert info["episode_frame_number"] == start + 4 * k
        assert ale.getEpisodeFrameNumber() == start + 4 * k


def test_frames_are_the_max_of_the_last_two_and_stack_in_order():
    """Replay the same seed and actions on an unpreprocessed frameskip=1 Pong (sticky
    actions included: same seed, same calls, same emulator), grabbing every screen."""
    seed = 3
    env = make_env(PONG, seed)
    obs, info = env.reset(seed=seed)
    raw = gym.make(PONG, frameskip=1)
    raw.reset(seed=seed)
    ale = raw.unwrapped.ale
    for _ in range(info["episode_frame_number"]):      # the same no-op start
        raw.step(NOOP)
    # After a reset all four frames are the first screen.
    assert all(np.array_equal(frame, grey84(ale.getScreenGrayscale())) for frame in obs)

    rng = np.random.default_rng(0)
    pooled_differs = 0
    history = [obs[-1]] * 4
    for _ in range(40):
        action = int(rng.integers(env.action_space.n))
        obs, *_ = env.step(action)
        screens = []
        for _ in range(4):
            raw.step(action)
            screens.append(ale.getScreenGrayscale())
        expected = grey84(np.maximum(screens[-2], screens[-1]))
        assert np.array_equal(obs[-1], expected)
        history = history[1:] + [expected]
        assert all(np.array_equal(a, b) for a, b in zip(obs, history))   # oldest first
        pooled_differs += not np.array_equal(expected, grey84(screens[-1]))
    # The max-pooling is seen: the last frame alone would differ on many steps.
    assert pooled_differs >= 10
    raw.close()


def test_noop_starts_vary_the_start_across_seeds():
    """The first screens of Pong are still the same for 30 frames, so the start shows
    in the emulator's frame count and in the observations a few steps on: with no-op
    starts they differ across seeds, without them (noop_max=0) they do not."""
    def start(seed, **kw):
        env = make_env(PONG, seed, **kw)
        _, info = env.reset(seed=seed)
        for _ in range(20):
            obs, *_ = env.step(NOOP)     # NOOP: sticky actions change nothing
        env.close()
        return info["episode_frame_number"], obs.tobytes()

    with_noops = [start(seed) for seed in range(4)]
    frames = [f for f, _ in with_noops]
    assert all(1 <= f <= 30 for f in frames) and len(set(frames)) >= 3
    assert len({obs for _, obs in with_noops}) >= 3
    without = [start(seed, noop_max=0) for seed in range(4)]
    assert {f for f, _ in without} == {0} and len({obs for _, obs in without}) == 1


@pytest.mark.parametrize("on", [True, False])
def test_terminal_on_life_loss_ends_breakout_at_the_first_lost_life(on):
    env = make_env(BREAKOUT, 1, terminal_on_life_loss=on)
    _, info = env.reset(seed=1)
    assert info["lives"] == 5
    first_loss = None
    for step in range(2_000):
        _, _, terminated, truncated, info = env.step(FIRE)   # launch, never move
        if first_loss is None and info["lives"] < 5:
            first_loss = step
        if terminated or truncated:
            break
    assert first_loss is not None and not truncated
    if on:
        assert step == first_loss and info["lives"] == 4
    else:
        assert step > first_loss and info["lives"] == 0     # the whole game


def test_preprocessing_options_and_switching_it_off():
    env = make_env(PONG, 0, frame_stack=2, screen_size=64)
    assert env.observation_space == gym.spaces.Box(0, 255, (2, 64, 64), np.uint8)
    raw = make_env(PONG, 0, atari_preprocessing=False)
    assert raw.observation_space.shape == (210, 160, 3)
    assert raw.unwrapped._frameskip == 4              # v5 as registered
    assert is_atari(PONG) and is_atari("PongNoFrameskip-v4")
    assert not is_atari("CartPole-v1") and not is_atari("ALE/NoSuchGame-v5")


@pytest.mark.parametrize("env_id, kw, message", [
    ("ALE/Pongg-v5", {}, "env: cannot make 'ALE/Pongg-v5': Environment `Pongg` doesn't "
                         "exist in namespace ALE. Did you mean: `Pong`?"),
    ("NoSuchEnv-v0", {}, "env: cannot make 'NoSuchEnv-v0'"),
    ("ALE/Pongg-v5", {"terminal_on_life_loss": True}, "env: cannot make 'ALE/Pongg-v5'"),
    ("CartPole-v1", {"terminal_on_life_loss": True},
     "terminal_on_life_loss: only for Atari (ALE/...) ids; 'CartPole-v1' is not one"),
    (PONG, {"noop_max": -1}, "noop_max: must be an integer >= 0, got -1"),
    (PONG, {"frame_stack": 0}, "frame_stack: must be an integer >= 1, got 0"),
])
def test_make_env_errors_name_the_id_or_keyword(env_id, kw, message):
    with pytest.raises(ConfigError) as err:
        make_env(env_id, 0, **kw)
    assert str(err.value).startswith(message)


def test_terminal_on_life_loss_flag_reaches_the_actors_and_only_atari_takes_it():
    cfg = load_config(["--env", BREAKOUT, "--atari-terminal-on-life-loss"])
    assert cfg.atari_terminal_on_life_loss
    assert not load_config(["--env", BREAKOUT]).atari_terminal_on_life_loss
    with pytest.raises(ConfigError, match="^atari_terminal_on_life_loss: applies to Atari "
                                          "\\(ALE/...\\) ids only, not 'CartPole-v1'"):
        load_config(["--env", "CartPole-v1", "--atari-terminal-on-life-loss"])

    for on in (True, False):
        cfg = dataclasses.replace(Config(env=BREAKOUT, envs_per_actor=2, batch_size=4),
                                  atari_terminal_on_life_loss=on)
        probe = make_env(cfg.env, 0)
        algo = DQN(probe.observation_space, probe.action_space, DQNConfig(cnn="nips"))
        spec = transition_spec(*obs_info(probe))
        with SharedReplay(spec, 64) as replay:
            actor = Actor(cfg, algo.make_policy(0, 1), replay, 0,
                          WeightStore(algo.num_params), 0, 1)
            assert [e.get_wrapper_attr("terminal_on_life_loss") for e in actor.envs] == [on] * 2
            actor.step(0.0)                               # frames flow into the replay
            assert actor.obs.dtype == np.uint8
            actor.close()


# ---- the CNN torsos ----------------------------------------------------------------------

def conv_params(c_in, c_out, k):
    return c_in * c_out * k * k + c_out


def test_torso_parameter_counts_are_the_papers():
    # Nature (Mnih et al. 2015), 4x84x84 input: 84 -> 20 -> 9 -> 7.
    nature = (conv_params(4, 32, 8) + conv_params(32, 64, 4) + conv_params(64, 64, 3)
              + 64 * 7 * 7 * 512 + 512)
    # NIPS (Mnih et al. 2013), 4x84x84 input: 84 -> 20 -> 9.
    nips = conv_params(4, 16, 8) + conv_params(16, 32, 4) + 32 * 9 * 9 * 256 + 256
    assert (nature, nips) == (1_684_128, 676_144)
    count = lambda net: sum(p.numel() for p in net.parameters())      # noqa: E731
    assert count(nature_cnn((4, 84, 84))) == nature
    assert count(nips_cnn((4, 84, 84))) == nips
    convs = [(m.in_channels, m.out_channels, m.kernel_size, m.stride)
             for m in nature_cnn((4, 84, 84)).modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs == [(4, 32, (8, 8), (4, 4)), (32, 64, (4, 4), (2, 2)), (64, 64, (3, 3), (1, 1))]


@pytest.mark.parametrize("make, width", [(nature_cnn, 512), (nips_cnn, 256)])
def test_torso_scales_uint8_frames_to_unit_range_inside(make, width):
    net = make((4, 84, 84))
    x = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    out = net(x)
    assert out.shape == (3, width) and out.dtype == torch.float32
    full = torch.full((2, 4, 84, 84), 255, dtype=torch.uint8)
    # 255 in = 1.0 into the conv stack (body: the network without the scaling), which
    # takes the frames channels-last.
    ones = torch.ones(2, 4, 84, 84).contiguous(memory_format=torch.channels_last)
    assert torch.equal(net(full), net.body(ones))
    assert not torch.equal(net(full), net.body(full.float()))
    torch.testing.assert_close(out, net.body(x.float() / 255))
    with pytest.raises(TypeError, match="uint8"):
        net(x.float())                   # a float frame would be scaled twice or never


def test_torso_factory_picks_a_cnn_for_frames_and_an_mlp_for_vectors():
    assert is_image(FRAMES) and not is_image(gym.spaces.Box(-1, 1, (4, 84, 84), np.float32))
    cnn = torso(FRAMES, "nips")
    assert isinstance(cnn, CNNTorso) and cnn.kind == "nips" and cnn.out_features == 256
    mlp = torso(gym.spaces.Box(-1, 1, (3, 2), np.float32), hidden=(16, 8))
    assert isinstance(mlp, MLPTorso) and mlp.out_features == 8
    assert mlp(torch.zeros(5, 3, 2)).shape == (5, 8)
    with pytest.raises(ConfigError, match="^cnn: must be one of nature, nips, minatar; got 'big'"):
        torso(FRAMES, "big")
    # Unpreprocessed (H, W, C) screens: a clear error naming the env, not a crash.
    with pytest.raises(ConfigError, match=r"^env: frames of shape \(210, 160, 3\)"):
        DQN(gym.spaces.Box(0, 255, (210, 160, 3), np.uint8), gym.spaces.Discrete(6))


# ---- DQN on frames -----------------------------------------------------------------------

@pytest.mark.parametrize("cnn, torso_params", [("nature", 1_684_128), ("nips", 676_144)])
def test_dqn_on_frames_uses_the_cnn_and_keeps_them_uint8(cnn, torso_params):
    dqn = DQN(FRAMES, gym.spaces.Discrete(6), DQNConfig(cnn=cnn), seed=1)
    width = 512 if cnn == "nature" else 256
    assert dqn.num_params == torso_params + width * 6 + 6
    assert dqn.signature()["cnn"] == cnn
    rng = np.random.default_rng(0)
    frames = lambda n: rng.integers(0, 256, (n, 4, 84, 84), dtype=np.uint8)  # noqa: E731
    assert dqn._obs(frames(2)).dtype == torch.uint8         # scaled inside the network
    batch = {"obs": frames(8), "action": rng.integers(0, 6, 8),
             "reward": rng.normal(size=8).astype(np.float32), "next_obs": frames(8),
             "discount": np.full(8, 0.99, np.float32), "weights": np.ones(8, np.float32)}
    grad = np.zeros(dqn.num_params, np.float32)
    _, priorities = dqn.compute_gradients("q", batch, grad)
    assert np.isfinite(grad).all() and np.abs(grad).sum() > 0 and priorities.shape == (8,)
    before = dqn.get_flat_params()
    dqn.apply_gradients("q", grad)
    assert not np.array_equal(before, dqn.get_flat_params())
    policy = dqn.make_policy(0, 1)
    policy.set_flat_params(dqn.policy_params())
    obs = frames(3)
    actions = policy.act(obs, rng, 0.0, deterministic=True)
    assert actions.dtype == np.int64 and actions.shape == (3,)
    np.testing.assert_array_equal(actions, dqn.act(obs, 0.0, rng))   # the CPU copy agrees


def test_dqn_on_vectors_is_unchanged():
    """The vector path builds the same layers in the same order as before the CNN came:
    the same parameters for the same seed, under the same state_dict names."""
    obs = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    dqn = DQN(obs, gym.spaces.Discrete(2), DQNConfig(hidden=[32, 16]), seed=3)
    layers = seeded(3, lambda: [torch.nn.Linear(4, 32), torch.nn.Linear(32, 16),
                                torch.nn.Linear(16, 2)])
    expected = torch.cat([t.detach().reshape(-1) for layer in layers
                          for t in (layer.weight, layer.bias)]).numpy()
    np.testing.assert_array_equal(dqn.get_flat_params(), expected)
    assert list(dqn.online.state_dict()) == ["trunk.0.weight", "trunk.0.bias",
                                             "trunk.2.weight", "trunk.2.bias",
                                             "head.weight", "head.bias"]
    assert "cnn" not in dqn.signature()


# ---- the real entry point ----------------------------------------------------------------

@pytest.mark.mpi
def test_dqn_trains_on_pong_through_the_entry_point(tmp_path):
    run_dir = tmp_path / "pong"
    cmd = pal_cmd(2, run_dir, "--algo", "dqn", "--env", PONG, "--cnn", "nips",
                  "--total-steps", "400", "--learning-starts", "200", "--batch-size", "32",
                  "--replay-ratio", "8", "--replay-capacity", "1000", "--envs-per-actor", "2",
                  "--eval-episodes", "1", "--overwrite", fast=False)
    proc = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env"] == PONG and summary["exit_status"] == 0
    assert summary["env_steps"] >= 400 and summary["updates"] > 0
    assert summary["learner_params_identical"]
    assert -21 <= summary["final_eval_return"] <= 21          # a whole game was played
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["env"] == PONG and saved["dqn"]["cnn"] == "nips"
