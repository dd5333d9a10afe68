"""The rank loop's fixed latencies: the timer slack that stretched every short sleep,
the BLAS threads numpy would start per core, and the per-learner profile (wall ms per
update by part) the summary records."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

from conftest import pal_summary

PR_GET_TIMERSLACK = 30


def test_tighten_timer_slack_sets_the_slack():
    code = ("import ctypes; from pal_hpc.runtime.pacing import tighten_timer_slack as t; "
            "ok = t(); print(ok, ctypes.CDLL(None).prctl(30, 0, 0, 0, 0))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["True", "1000"]
    # ... and this process (not tightened) still has the kernel's default.
    assert ctypes.CDLL(None).prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0) != 1000


def test_limit_threads_sets_numpys_openblas():
    """numpy's OpenBLAS, started with no thread variable set (as under a plain mpiexec),
    takes the rank's thread count at run time, and torch too."""
    code = ("import json, numpy, torch; from pal_hpc.runtime.threads import limit_threads, "
            "openblas_threads as ob; seen = []\n"
            "for n in (3, 1):\n"
            "    libs = limit_threads(n); seen.append([libs, ob(), torch.get_num_threads()])\n"
            "print(json.dumps(seen))")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True, env=env).stdout
    for (libs, threads, torch_threads), n in zip(json.loads(out), (3, 1)):
        assert any("openblas" in p for p in libs)      # numpy's wheel's, at least
        assert set(threads) == set(libs) and set(threads.values()) == {n}
        assert torch_threads == n


def test_summary_profiles_every_learner(tmp_path):
    summary = pal_summary(3, tmp_path / "run", "--learners-per-node", "2",
                          "--total-steps", "2500", "--algo", "dqn")
    profiles = summary["learner_profile"]
    assert len(profiles) == 2 and summary["updates"] > 0
    for p in profiles:
        parts = {k: v for k, v in p.items() if k != "wall_per_update"}
        assert set(parts) >= {"sample", "gradients", "reduce", "apply", "sleep_reducing",
                              "rate_limited", "loop_other"}
        assert all(v >= 0 for k, v in parts.items() if k != "loop_other")
        assert p["gradients"] > 0 and p["reduce"] > 0
        assert p["sleep_reducing"] <= p["reduce"]        # its sleeps are inside the wait
        accounted = sum(parts.values()) - p["sleep_reducing"]
        assert abs(accounted - p["wall_per_update"]) < 1e-2 * p["wall_per_update"] + 1e-3
