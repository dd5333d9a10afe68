"""The metrics log of a real run: readable while the run writes it, after the run is
killed with SIGKILL, and by the offline analysis in both cases."""

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, mpi_env, pal_cmd
from pal_hpc.io.metrics import read_metrics

pytestmark = pytest.mark.mpi


def test_log_of_a_running_then_killed_run(tmp_path):
    run_dir = tmp_path / "run"
    cmd = pal_cmd(3, run_dir, "--total-steps", "10000000", "--eval-every", "2000",
                  fast=False) + ["--hidden", "32", "32", "--learning-starts", "500",
                                 "--eval-episodes", "2", "--progress-every", "0.5"]
    env = mpi_env()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        rows = {}
        while time.monotonic() < deadline:       # read it while it is being written
            time.sleep(1.0)
            if (run_dir / "metrics.h5").exists():
                m = read_metrics(run_dir / "metrics.h5")
                rows = {k: len(m[k]) for k in ("episodes", "learner", "evaluation", "system")}
                if all(rows.values()):
                    break
        assert all(rows.values()), rows
    finally:
        os.killpg(proc.pid, signal.SIGKILL)      # no chance to clean up
        proc.communicate(timeout=60)
    after = read_metrics(run_dir / "metrics.h5")
    assert all(len(after[k]) >= rows[k] for k in rows)
    assert not (run_dir / "summary.json").exists()
    out = subprocess.run([sys.executable, "-m", "pal_hpc.analyze", str(run_dir),
                          "--threshold", "100000"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "killed" in out.stdout or "in progress" in out.stdout
    png = (run_dir / "learning_curve_steps.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
