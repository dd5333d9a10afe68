"""Fault injection: kill a random rank with SIGKILL at a random moment, resume with
--resume auto (what a requeued job does), five times over, then finish.

After every kill: the job ended (no rank left behind), every checkpoint left verifies,
and the newest one never holds fewer env steps than the one before.  The final run
reaches its step budget, and the metrics of all the attempts read back as one log.
"""

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import h5py
import pytest

from conftest import ROOT, mpi_env, pal_cmd, rank_processes
from pal_hpc.io import checkpoint as ckpt
from pal_hpc.io.metrics import read_run_metrics

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

NPROCS = 3
FLAGS = ["--resume", "auto", "--checkpoint-every", "0.5", "--progress-every", "0.5"]


def newest_env_steps(run_dir: Path) -> int:
    mains = ckpt.list_checkpoints(run_dir)
    if not mains:
        return 0
    with h5py.File(mains[-1], "r") as f:
        return int(f.attrs["env_steps"])


def test_random_sigkills_then_resume_auto(tmp_path):
    rng = random.Random(int(os.environ.get("PAL_HPC_FAULT_SEED", "0")) or None)
    run_dir = tmp_path / "run"
    last_steps = 0
    kills = []
    for attempt in range(5):
        proc = subprocess.Popen(pal_cmd(NPROCS, run_dir, "--total-steps", "100000000", *FLAGS),
                                cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            # A random moment: from start-up (perhaps before the first checkpoint, or
            # while one is written) to a few seconds into training.
            time.sleep(rng.uniform(1.0, 7.0))
            _, ranks = rank_processes(proc.pid)
            assert ranks, "no rank processes found under mpiexec"
            victim = rng.choice(ranks)
            os.kill(victim, signal.SIGKILL)
            kills.append((attempt, ranks.index(victim)))
            out, _ = proc.communicate(timeout=60)     # the whole job ends
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode != 0, out
        assert all(not Path(f"/proc/{pid}").exists() for pid in ranks), out
        for main in ckpt.list_checkpoints(run_dir):
            ckpt.verify_all(main)                      # every surviving checkpoint verifies
        steps = newest_env_steps(run_dir)
        assert steps >= last_steps, (attempt, steps, last_steps)
        last_steps = steps

    budget = last_steps + 3000
    proc = subprocess.run(pal_cmd(NPROCS, run_dir, "--total-steps", str(budget), *FLAGS),
                          cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= budget
    assert summary["learner_params_identical"]
    if last_steps:
        assert summary["resumed_from"] is not None
    for main in ckpt.list_checkpoints(run_dir):
        ckpt.verify_all(main)
    log = read_run_metrics(run_dir)                    # every attempt's rows, as one run
    assert log["unreadable"] == {} and len(log["segments"]) >= 1
    assert len(log["learner"]) > 0
    for name in ("learner", "system"):                  # no duplicated stretch of time
        wall = log[name]["wall_s"]
        assert len(wall) == 0 or (wall[1:] >= wall[:-1] - 2.5).all(), name
    print(f"kills (attempt, rank index): {kills}; newest checkpoint before the final run "
          f"held {last_steps} env steps")
