"""MinAtar (Young & Tian 2019) as an env family: its ids through gymnasium, its bool
channels as uint8 frames, the paper's network and DQN settings as the ids' defaults,
and a DQN run on a MinAtar game through the real entry point and its replay, resumed
exactly on another layout.  PAAC and PPO take the MinAtar network on the lockstep
runtime."""

import json
import subprocess
import warnings

import h5py
import numpy as np
import pytest
import torch

from conftest import ROOT, mpi_env, pal_cmd
from pal_hpc.algos.cnn import CNNTorso, conv_out, MINATAR
from pal_hpc.algos.optim import FlatRMSProp
from pal_hpc.config_io import config_from_dict
from pal_hpc.envs.make import is_minatar, make_env
from pal_hpc.io.checkpoint import list_checkpoints
from pal_hpc.options import ConfigError

GAMES = ["Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders"]


@pytest.mark.parametrize("game", GAMES)
def test_each_game_steps_as_uint8_frames_of_its_bool_channels(game):
    env_id = f"MinAtar/{game}-v1"
    assert is_minatar(env_id)
    env = make_env(env_id, seed=7)
    game_env = env.unwrapped.game
    assert game_env.sticky_action_prob == 0.1               # the paper's sticky actions
    h, w, c = game_env.state_shape()
    assert (h, w) == (10, 10)
    assert env.observation_space.shape == (c, 10, 10)
    assert env.observation_space.dtype == np.uint8
    obs, _ = env.reset(seed=7)
    for t in range(300):
        state = game_env.state()                           # the game's own bools
        assert state.dtype == bool
        assert obs.dtype == np.uint8 and obs.shape == (c, 10, 10)
        np.testing.assert_array_equal(obs, np.moveaxis(state, -1, 0).astype(np.uint8) * 255)
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()


def test_a_seed_replays_the_same_game():
    def rollout(seed):
        env = make_env("MinAtar/Breakout-v1", seed=seed)
        env.action_space.seed(seed)
        frames = [env.reset(seed=seed)[0]]
        for _ in range(200):
            obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            frames.append(obs)
            if terminated or truncated:
                frames.append(env.reset()[0])
        return np.stack(frames)

    np.testing.assert_array_equal(rollout(3), rollout(3))
    assert not np.array_equal(rollout(3), rollout(4))


def test_only_a_minimal_action_set_id_gets_the_action_set_note():
    from pal_hpc.envs.make import minatar_action_set_note

    assert minatar_action_set_note("MinAtar/Breakout-v1").endswith(
        "used all six actions (MinAtar/Breakout-v0)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert make_env("MinAtar/Breakout-v0", 0).action_space.n == 6
    # gymnasium's "v0 is out of date" is not passed on: -v0 is the paper's action set
    assert not [w for w in caught if "out of date" in str(w.message)]
    for env_id in ("MinAtar/Breakout-v0", "CartPole-v1", "ALE/Pong-v5"):
        assert minatar_action_set_note(env_id) == ""


def test_atari_keywords_are_refused_for_a_minatar_id():
    with pytest.raises(ConfigError, match="frame_stack: only for Atari"):
        make_env("MinAtar/Breakout-v1", 0, frame_stack=2)


def test_the_minatar_network_is_the_papers():
    torso = CNNTorso((4, 10, 10), "minatar")
    convs = [m for m in torso.body if isinstance(m, torch.nn.Conv2d)]
    dense = [m for m in torso.body if isinstance(m, torch.nn.Linear)]
    assert [(m.out_channels, m.kernel_size, m.stride) for m in convs] == [(16, (3, 3), (1, 1))]
    assert conv_out(10, MINATAR[0]) == 8
    assert [(m.in_features, m.out_features) for m in dense] == [(16 * 8 * 8, 128)]
    frames = torch.zeros((2, 4, 10, 10), dtype=torch.uint8)
    frames[0, 1, 3, 4] = 255
    out = torso(frames)
    assert out.shape == (2, 128)
    # 255 is the paper's 1: the torso's body sees exactly 0/1 inputs.
    ref = torso.body(torch.zeros((2, 4, 10, 10)).index_put_(
        (torch.tensor([0]), torch.tensor([1]), torch.tensor([3]), torch.tensor([4])),
        torch.tensor([1.0])))
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    with pytest.raises(ConfigError, match="too small for the nature CNN"):
        CNNTorso((4, 10, 10), "nature")


def test_minatar_ids_default_to_the_papers_dqn_and_flags_win():
    cfg = config_from_dict({"algo": "dqn", "env": "MinAtar/Breakout-v1"})
    a = cfg.algo_config
    assert (a.optimizer, a.lr, a.rms_decay, a.rms_eps) == ("rmsprop", 2.5e-4, 0.95, 0.01)
    assert (a.cnn, a.target_update, a.double_q, a.dueling, a.loss) == (
        "minatar", 1000, False, False, "huber")
    assert (a.eps_final, a.exploration_steps) == (0.1, 100_000)
    assert (cfg.replay_capacity, cfg.batch_size, cfg.learning_starts, cfg.replay_ratio,
            cfg.n_step, cfg.per_alpha, cfg.gamma, cfg.total_steps) == (
        100_000, 32, 5_000, 32.0, 1, 0.0, 0.99, 5_000_000)
    mine = config_from_dict({"algo": "dqn", "env": "MinAtar/Breakout-v1", "n_step": 3,
                             "per_alpha": 0.5, "optimizer": "adam", "double_q": True})
    assert (mine.n_step, mine.per_alpha, mine.algo_config.optimizer,
            mine.algo_config.double_q, mine.algo_config.cnn) == (3, 0.5, "adam", True, "minatar")
    rr = config_from_dict({"algo": "dqn", "env": "MinAtar/Breakout-v1",
                           "minatar_preset": "revisiting-rainbow"})
    assert (rr.algo_config.optimizer, rr.algo_config.lr, rr.algo_config.adam_eps,
            rr.algo_config.target_update, rr.algo_config.eps_final, rr.learning_starts,
            rr.replay_ratio, rr.total_steps) == ("adam", 2.5e-4, 3.125e-4, 250, 0.01, 1_000,
                                                 8.0, 10_000_000)
    for algo in ("paac", "ppo"):
        assert config_from_dict({"algo": algo, "env": "MinAtar/Breakout-v1"}
                                ).algo_config.cnn == "minatar"
    # Other ids keep their defaults.
    cart = config_from_dict({"algo": "dqn", "env": "CartPole-v1"})
    assert (cart.algo_config.optimizer, cart.algo_config.cnn) == ("adam", "nature")
    with pytest.raises(ConfigError, match="optimizer"):
        config_from_dict({"algo": "dqn", "optimizer": "sgd"}).validate()
    with pytest.raises(ConfigError, match="minatar_preset"):
        config_from_dict({"algo": "dqn", "env": "MinAtar/Breakout-v1",
                          "minatar_preset": "rainbow"}).validate()


def test_centered_rmsprop_is_torchs_and_its_state_round_trips():
    torch.manual_seed(0)
    p = torch.randn(300)
    q = p.clone().requires_grad_(True)
    ours = FlatRMSProp(p, lr=2.5e-4, decay=0.95, eps=0.01, eps_in_sqrt=False,
                       initial_square=0.0, centered=True)
    ref = torch.optim.RMSprop([q], lr=2.5e-4, alpha=0.95, eps=0.01, centered=True)
    for _ in range(50):
        g = torch.randn(300)
        ours.step(g.clone())
        q.grad = g.clone()
        ref.step()
    torch.testing.assert_close(p, q.detach(), rtol=0, atol=1e-7)
    state = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in ours.state_dict().items()}
    assert state["centered"] is True and state["grad_avg"].shape == p.shape
    twin = FlatRMSProp(p.clone(), lr=2.5e-4, decay=0.95, eps=0.01, eps_in_sqrt=False,
                       initial_square=0.0, centered=True)
    twin.load_state_dict(state)
    g = torch.randn(300)
    ours.step(g.clone())
    twin.step(g.clone())
    torch.testing.assert_close(ours.param, twin.param, rtol=0, atol=0)
    # An uncentered optimizer refuses a centered state, and keeps its old keys.
    plain = FlatRMSProp(torch.zeros(300))
    assert "grad_avg" not in plain.state_dict() and "centered" not in plain.state_dict()
    with pytest.raises(ValueError, match="centered"):
        plain.load_state_dict(state)


def summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


DQN_FLAGS = ["--algo", "dqn", "--env", "MinAtar/SpaceInvaders-v1", "--replay-capacity", "3000",
             "--learning-starts", "300", "--replay-ratio", "8", "--checkpoint-replay",
             "--eval-every", "0"]


@pytest.mark.mpi
def test_dqn_runs_on_a_minatar_game_and_resumes_exactly_on_another_layout(tmp_path):
    run_dir = tmp_path / "run"
    res = subprocess.run(pal_cmd(2, run_dir, *DQN_FLAGS, "--total-steps", "1500", fast=False),
                         cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "dqn on MinAtar/SpaceInvaders-v1" in res.stdout
    assert ("note: MinAtar/SpaceInvaders-v1 has the game's minimal action set; the MinAtar "
            "paper's results used all six actions (MinAtar/SpaceInvaders-v0)") in res.stdout
    first = summary(run_dir)
    assert first["env_steps"] >= 1500 and first["updates"] > 0
    ckpt = list_checkpoints(run_dir)[-1]
    with h5py.File(ckpt, "r") as f:
        saved_digest = f.attrs["params_digest"]
        replay_files = json.loads(f.attrs["replay_files"])
    rows = 0
    for name in replay_files:
        with h5py.File(ckpt.parent / name, "r") as f:
            found = []
            f.visit(found.append)
            for key in found:
                if key.endswith("column.obs") or key.endswith("column.next_obs"):
                    frames = f[key][...]
                    assert frames.shape[1:] == (6, 10, 10) and frames.dtype == np.uint8
                    assert set(np.unique(frames)) <= {0, 255}
                    assert frames[:, 0].any()          # the cannon is on every frame
                    rows += len(frames) if key.endswith("column.obs") else 0
    assert rows > 0
    # Resumed by one rank (actor and learner in one process): the replay re-split.
    res = subprocess.run(pal_cmd(1, run_dir, *DQN_FLAGS, "--total-steps", "2500", "--resume", "latest",
                                 fast=False),
                         cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    second = summary(run_dir)
    assert second["params_digest_at_start"] == saved_digest        # bit-identical restore
    assert second["replay_size_at_start"] == rows
    assert second["env_steps"] >= 2500 and second["updates"] > first["updates"]


@pytest.mark.mpi
@pytest.mark.parametrize("algo", ["paac", "ppo"])
def test_the_lockstep_runtime_trains_on_a_minatar_game(tmp_path, algo):
    run_dir = tmp_path / algo
    res = subprocess.run(pal_cmd(2, run_dir, "--algo", algo, "--env", "MinAtar/Breakout-v1",
                                 "--total-steps", "2048", "--eval-every", "1024",
                                 "--eval-episodes", "2", fast=False),
                         cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = summary(run_dir)
    assert out["env_steps"] >= 2048 and out["final_eval_return"] is not None
    assert "note: MinAtar/Breakout-v1 has the game's minimal action set" in res.stdout
    with h5py.File(list_checkpoints(run_dir)[-1], "r") as f:
        cfg = json.loads(f.attrs["config"])
    assert cfg[algo]["cnn"] == "minatar"


class _StayPut:
    """A deterministic policy that always takes action 0 (no-op): in Seaquest the sub
    then idles at the surface, and the game never ends."""

    def act(self, obs, rng, eps, deterministic=False):
        return np.zeros(len(obs), np.int64)


def test_an_evaluation_that_would_never_end_is_cut_at_eval_max_steps(capsys, monkeypatch):
    from pal_hpc.config import Config
    from pal_hpc.runtime import evaluation

    monkeypatch.setattr(evaluation, "_cut_reported", False)    # said once a process

    env = make_env("MinAtar/Seaquest-v1", seed=0)       # the game really never ends
    env.reset(seed=0)
    for _ in range(5_000):
        _, _, terminated, truncated, _ = env.step(0)
        assert not (terminated or truncated)
    cfg = Config(env="MinAtar/Seaquest-v1", eval_max_steps=400)
    returns = evaluation.evaluate(cfg, _StayPut(), 3, seed=11)      # returned: not a hang
    assert returns.shape == (3,) and np.all(returns == 0)
    out = capsys.readouterr().out
    assert "3 of 3 episodes of MinAtar/Seaquest-v1" in out and "eval_max_steps=400" in out
    assert Config().eval_max_steps == 27_000           # Atari's 108,000 frames
