"""A DQN run on ALE/Pong-v5 with frames stored once, preempted and resumed through the
real entry point: the checkpoint's replay file holds one (84, 84) frame per stored
transition (not two (4, 84, 84) stacks), and the resumed run starts from those rows and
the saved parameters bit for bit, then finishes its budget."""

import json
import subprocess
import time

import h5py
import numpy as np
import pytest

from conftest import ROOT, STOP_SIGNAL, mpi_env, pal_cmd
from pal_hpc.io.checkpoint import list_checkpoints

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

# Small and quick: a 4,000-transition buffer, few updates (batch 8, 1 sample per env
# step), the smallest CNN; Pong's frames and episode structure are what is tested.
FLAGS = ["--algo", "dqn", "--env", "ALE/Pong-v5", "--replay-capacity", "4000",
         "--learning-starts", "600", "--batch-size", "8", "--replay-ratio", "1",
         "--envs-per-actor", "2", "--checkpoint-replay", "--eval-every", "0"]


def summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def test_frame_replay_checkpoint_resumes_the_run(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(pal_cmd(2, run_dir, *FLAGS, "--total-steps", "10000000"),
                            cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    lines = []
    for line in proc.stdout:           # wait until the learner has taken updates
        lines.append(line)
        if ("updates" in line and " 0 (" not in line.split("updates")[1][:12]) \
                or time.monotonic() > deadline:
            break
    proc.send_signal(STOP_SIGNAL)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 75, "".join(lines) + out + err
    assert "frames stored once" in "".join(lines)
    first = summary(run_dir)
    assert first["updates"] > 0 and first["env_steps"] > 600

    main = list_checkpoints(run_dir)[-1]
    with h5py.File(main, "r") as f:
        saved_digest = f.attrs["params_digest"]
        replay_files = json.loads(f.attrs["replay_files"])
    assert len(replay_files) == 1
    with h5py.File(main.parent / next(iter(replay_files)), "r") as f:
        names = []
        f.visit(names.append)
        obs = [f[k] for k in names if k.endswith("column.obs")]
        assert len(obs) == 1, names
        stored = obs[0].shape[0]
        assert obs[0].shape[1:] == (84, 84) and obs[0].dtype == np.uint8   # one frame a row
        assert not any("next_obs" in k for k in names), names
        assert 600 < stored <= 4000

    more = first["env_steps"] + 600
    proc = subprocess.run(pal_cmd(2, run_dir, *FLAGS, "--resume", "latest",
                                  "--total-steps", str(more)),
                          cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    second = summary(run_dir)
    assert second["resumed_from"] == str(main)
    assert second["params_digest_at_start"] == saved_digest          # bit-identical restore
    assert second["replay_size_at_start"] == stored                 # every frame row back
    assert second["env_steps"] >= more and second["updates"] > first["updates"]
    assert second["learner_params_identical"] and second["exit_status"] == 0
