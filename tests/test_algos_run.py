"""Every algorithm through the real entry point: several learners keep bit-identical
parameters (one Allreduce per update phase), a checkpoint resumes exactly, the metrics
log carries the algorithm's own columns, and bad input is refused before any work.

The maths of each algorithm is tested in its own file (test_dqn, test_ddpg, test_td3,
test_sac); this file checks the runtime drives them all the same way."""

import json
import subprocess

import h5py
import pytest

from conftest import ROOT, mpi_env, pal_cmd
from pal_hpc.algos import ALGOS
from pal_hpc.io.metrics import read_run_metrics

pytestmark = pytest.mark.mpi

# Small and short: Pendulum with tiny networks.
SMALL = ["--env", "Pendulum-v1", "--hidden", "32", "32", "--random-steps", "200",
         "--learning-starts", "300", "--batch-size", "32", "--replay-ratio", "48",
         "--replay-capacity", "20000"]
CONTINUOUS = [*SMALL, "--learners-per-node", "2"]    # at -n 4: 2 learners, 2 actors


def run(cmd, timeout=240):
    return subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True,
                          timeout=timeout)


def summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.parametrize("algo", ["ddpg", "td3", "sac"])
def test_continuous_algorithm_trains_checkpoints_and_resumes(tmp_path, algo):
    run_dir = tmp_path / "run"
    proc = run(pal_cmd(4, run_dir, "--algo", algo, *CONTINUOUS, "--total-steps", "700"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = summary(run_dir)
    assert first["algo"] == algo and first["learners"] == 2 and first["actors"] == 2
    assert first["updates"] > 50
    assert first["learner_params_identical"]           # both learners, every phase
    with h5py.File(first["checkpoint"], "r") as f:
        saved_digest = f.attrs["params_digest"]
        assert json.loads(f.attrs["algo_signature"])["algo"] == algo
    log = read_run_metrics(run_dir)
    assert log["learner"].dtype.names[3:] == ALGOS[algo].metric_names
    assert len(log["learner"]) > 0

    proc = run(pal_cmd(4, run_dir, "--algo", algo, *CONTINUOUS, "--total-steps", "1200",
                       "--resume", "latest"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    second = summary(run_dir)
    assert second["params_digest_at_start"] == saved_digest     # exact restore
    assert second["updates"] > first["updates"] and second["env_steps"] >= 1200
    assert second["learner_params_identical"]


@pytest.mark.parametrize("flags, message", [
    (["--algo", "td3", "--env", "CartPole-v1"],
     "env: td3 needs a Box action space; CartPole-v1 has Discrete(2)"),
    (["--algo", "sac", "--env", "CartPole-v1"], "env: sac needs a Box action space"),
    (["--algo", "dqn", "--env", "Pendulum-v1"],
     "env: dqn needs a Discrete action space; Pendulum-v1 has Box"),
    (["--algo", "dqn", "--policy-delay", "2"],
     "policy_delay: an option of td3; --algo dqn does not take it"),
    (["--algo", "sac", "--tau", "nan"], "tau: must be finite"),
    (["--algo", "td3", "--env", "Pendulum-v1", "--actor-lr", "-1"], "actor_lr: "),
    (["--algo", "ddpg", "--env", "Pendulum-v1", "--action-noise", "-0.1"], "action_noise: "),
])
def test_bad_input_is_refused_naming_the_field(tmp_path, flags, message):
    proc = run(pal_cmd(2, tmp_path / "run", *flags), timeout=90)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert text.count("invalid configuration") == 1 and "Traceback" not in text, text
    assert message in text, text


def test_a_checkpoint_of_one_algorithm_is_not_resumed_as_another(tmp_path):
    run_dir = tmp_path / "run"
    proc = run(pal_cmd(2, run_dir, "--algo", "td3", *SMALL, "--total-steps", "600"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run(pal_cmd(2, run_dir, "--algo", "sac", *SMALL, "--total-steps", "1200",
                       "--resume", "latest"), timeout=90)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "algo: the checkpoint was trained with 'td3', this run asks for 'sac'" in text, text
