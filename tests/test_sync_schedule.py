"""--schedule sync through the real entry point: one seed and layout give bit-identical
final parameters run after run (1, 2, 3 ranks; two virtual nodes; two learners sharing
a node's prioritized replay), another seed differs, bad round settings are refused
before any work, and SIGTERM stops at a round boundary with a checkpoint from which
every resume is the same run."""

import json
import shutil
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from conftest import ROOT, STOP_SIGNAL, mpi_env, pal_cmd, pal_summary

pytestmark = pytest.mark.mpi

SYNC = ["--schedule", "sync", "--round-steps", "40", "--round-updates", "3",
        "--learning-starts", "200", "--replay-capacity", "4000", "--total-steps", "2400"]


def digest(nprocs, run_dir, *flags):
    """Final parameter digest and summary of a finished sync run."""
    s = pal_summary(nprocs, run_dir, *SYNC, *flags)
    assert s["schedule"] == "sync" and s["learner_params_identical"]
    assert s["env_steps"] == 2400 and s["updates"] > 0, s
    return s["params_digest"], s


def test_sync_three_ranks_same_seed_same_parameters_other_seed_differs(tmp_path):
    a, sa = digest(3, tmp_path / "a", "--seed", "5")
    b, sb = digest(3, tmp_path / "b", "--seed", "5")
    c, _ = digest(3, tmp_path / "c", "--seed", "6")
    assert a == b, "two runs with one seed and layout ended with different parameters"
    assert a != c, "another seed gave the same parameters: the digest tells nothing"
    # Rounds are exact: 2 actors x 40 steps, 30 rounds, 3 updates a round once learning
    # started (200 transitions: after round 3), the same count in both runs.
    assert sa["updates"] == sb["updates"] == 3 * (30 - 2)
    assert sa["episodes"] == sb["episodes"]
    # Where every rank's rounds went: the phases add up to its wall per round, and the
    # ranks, in lockstep, spent the same wall on the 30 rounds.
    prof = sa["round_profile"]
    assert sorted(p["rank"] for p in prof) == [0, 1, 2], prof
    for p in prof:
        phases = sum(v for k, v in p.items() if k not in ("rank", "roles", "wall_per_round"))
        assert phases == pytest.approx(p["wall_per_round"], abs=0.01), p
        # A rank has the phases of its roles (no timing: a busy machine can preempt a
        # rank for a few ms between any two lines).
        assert ("act" in p) == ("write" in p) == ("actor" in p["roles"]), p
        assert ("learn" in p) == ("learner" in p["roles"]), p
    walls = [30 * p["wall_per_round"] for p in prof]
    assert max(walls) - min(walls) < 500, walls           # ms over the 30 rounds
    # DQN acts in numpy (acting.py): only the learner imported torch, the actors never did.
    assert sa["ranks_with_torch"] == [p["rank"] for p in prof if "learner" in p["roles"]]


@pytest.mark.slow
@pytest.mark.parametrize("nprocs,flags", [
    (1, ()),                                         # one rank: actor and learner
    (2, ()),
    (4, ("--ranks-per-node", "2")),                  # two virtual nodes, two replays
    (4, ("--learners-per-node", "2")),               # two learners' priority writes
    (5, ("--ranks-per-node", "3", "--learners-per-node", "1")),   # uneven nodes
], ids=["1rank", "2ranks", "2nodes", "2learners", "uneven-nodes"])
def test_sync_layouts_are_reproducible(tmp_path, nprocs, flags):
    a, _ = digest(nprocs, tmp_path / "a", *flags)
    b, _ = digest(nprocs, tmp_path / "b", *flags)
    assert a == b


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ddpg", "td3", "sac"])
def test_sync_continuous_algorithms_are_reproducible(tmp_path, algo):
    flags = ("--algo", algo, "--env", "Pendulum-v1", "--batch-size", "64")
    a, sa = digest(3, tmp_path / "a", *flags)
    b, sb = digest(3, tmp_path / "b", *flags)
    # The summaries in the message: a failure says which run differed and how far it got.
    assert a == b, (sa, sb)
    assert sa["updates"] == sb["updates"] and sa["episodes"] == sb["episodes"], (sa, sb)
    # The actors act in numpy (acting.py): only the learner imported torch.
    assert sa["ranks_with_torch"] == [p["rank"] for p in sa["round_profile"]
                                      if "learner" in p["roles"]], sa["round_profile"]
    if algo == "td3":      # the digest follows training (for one algorithm: it is shared)
        c, sc = digest(3, tmp_path / "c", *flags, "--seed", "1")
        assert c != a, (sa, sc)


@pytest.mark.parametrize("flags,message", [
    (["--envs-per-actor", "3", "--round-steps", "40"], "round_steps: must be a multiple"),
    (["--algo", "paac"], "schedule: sync applies to the off-policy"),
    (["--round-updates", "0"], "round_updates: must be >= 1"),
    (["--schedule", "lockstep"], "invalid choice"),
])
def test_sync_bad_settings_are_refused_naming_the_field(tmp_path, flags, message):
    proc = subprocess.run(pal_cmd(1, tmp_path / "r", "--schedule", "sync", *flags),
                          cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr
    assert not (tmp_path / "r" / "summary.json").exists()


def test_sync_round_larger_than_a_region_is_refused(tmp_path):
    proc = subprocess.run(pal_cmd(3, tmp_path / "r", *SYNC, "--replay-capacity", "60",
                                  "--learning-starts", "10", "--batch-size", "8"),
                          cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "round_steps: 40 steps a round" in proc.stdout + proc.stderr


def test_help_documents_the_schedule():
    proc = subprocess.run([sys.executable, "-m", "pal_hpc.main", "--help"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    text = " ".join(proc.stdout.split())
    for flag in ("--schedule {async,sync}", "--round-steps", "--round-updates"):
        assert flag in text


def _stopped_run(run_dir):
    """A long sync run signalled once training is under way; returns (exit, output)."""
    proc = subprocess.Popen(pal_cmd(3, run_dir, *SYNC, "--total-steps", "10000000"),
                            cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    lines = []
    for line in proc.stdout:                 # two progress lines with updates going
        lines.append(line)
        if sum("updates" in ln for ln in lines) >= 2 or time.monotonic() > deadline:
            break
    proc.send_signal(STOP_SIGNAL)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, "".join(lines) + out + err


@pytest.mark.slow
def test_sigterm_stops_at_a_round_boundary_and_every_resume_is_the_same_run(tmp_path):
    run_dir = tmp_path / "run"
    code, out = _stopped_run(run_dir)
    assert code == 75, out
    first = json.loads((run_dir / "summary.json").read_text())
    assert first["work_left"] and STOP_SIGNAL.name in first["stop_reason"]
    with h5py.File(first["checkpoint"], "r") as f:
        steps, updates = int(f.attrs["env_steps"]), int(f.attrs["updates"])
    assert steps % (2 * 40) == 0, "the checkpoint is not at a round boundary"
    assert updates % 3 == 0 and updates > 0
    more = str(steps + 800)
    digests = []
    for name in ("x", "y"):
        copy = tmp_path / name
        shutil.copytree(run_dir, copy)
        s = pal_summary(3, copy, *SYNC, "--resume", "latest", "--total-steps", more)
        assert s["resumed_from"].startswith(str(copy)) and s["exit_status"] == 0
        assert s["env_steps"] == int(more) and s["updates"] == updates + 3 * 10
        assert s["params_digest_at_start"] != s["params_digest"]
        digests.append(s["params_digest"])
    assert digests[0] == digests[1], "two resumes from one checkpoint differ"


def test_blackjack_tuple_observations_become_a_vector_and_mse_loss():
    from pal_hpc.algos.dqn import DQN, DQNConfig
    from pal_hpc.envs import make_env

    env = make_env("Blackjack-v1", 3)
    assert env.observation_space.shape == (3,)
    obs, _ = env.reset(seed=3)
    assert obs.dtype == np.float32 and obs.shape == (3,)
    assert env.observation_space.contains(obs)
    raw, _ = env.unwrapped.reset(seed=3), None
    assert np.array_equal(obs, np.asarray(raw[0], np.float32))
    algo = DQN(env.observation_space, env.action_space,
               DQNConfig(hidden=[32], loss="mse", double_q=False), seed=0)
    assert algo.num_params == 3 * 32 + 32 + 32 * 2 + 2          # the paper's 3-32-2
    rng = np.random.default_rng(0)
    batch = {"obs": rng.random((8, 3), np.float32), "action": rng.integers(0, 2, 8),
             "reward": rng.random(8).astype(np.float32) * 10,
             "next_obs": rng.random((8, 3), np.float32),
             "discount": np.full(8, 0.99, np.float32), "weights": np.ones(8, np.float32)}
    loss, _, td_abs = algo.loss(batch)
    assert float(loss.detach()) == pytest.approx(float(np.mean(td_abs ** 2)), rel=1e-5)
    assert td_abs.max() > 1.0         # where Huber and the squared error part
