"""Every rank starts each collective the same number of times, whatever the timing.

One rank is made slower than the others on purpose (PAL_HPC_INJECT_STALL: it sleeps
once, just before its first round of the job-wide counters), so that a round started
on a rank's own clock would be matched by the others never, every time -- not once in
a while, as the PAAC `--async-update` hang was (issue 18: two virtual nodes' masters,
one with a counter round in flight at the end that the other never posted).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import FAST_FLAGS, ROOT, mpi_env
from pal_hpc.cluster.launch import pal_main

STALL_S = 1.5     # far beyond the counters' 0.2 s period, and than the rest of the run
TIMEOUT_S = 90    # the hang this guards against ended after 120 s


def run(run_dir, *flags):
    cmd = pal_main(4, "--run-dir", str(run_dir), "--ranks-per-node", "2", *flags)
    try:
        return subprocess.run(cmd, cwd=ROOT, env=mpi_env(PAL_HPC_INJECT_STALL=f"2:{STALL_S}"),
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the job hung with rank 2 stalled ({' '.join(cmd)}):\n"
                    f"{exc.stdout or ''}\n{exc.stderr or ''}")


@pytest.mark.mpi
@pytest.mark.parametrize("schedule", [[], ["--async-update"], ["--no-overlap"]],
                         ids=["overlap", "async-update", "no-overlap"])
def test_paac_masters_start_the_same_counter_rounds(tmp_path, schedule):
    """Two virtual nodes; the second node's master (rank 2) stalls at its first counter
    round, and the run (6 updates) ends well within one counter period after it."""
    run_dir = tmp_path / "run"
    proc = run(run_dir, "--algo", "paac", "--hidden", "32", "32", "--num-envs", "8",
               "--total-steps", "480", "--eval-every", "0", "--eval-episodes", "2",
               *schedule)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["updates"] == 480 // 80 and s["learner_params_identical"]
    assert s["env_steps"] == 480


@pytest.mark.mpi
def test_offpolicy_ranks_start_the_same_counter_rounds(tmp_path):
    """The off-policy loop stops through the counter rounds themselves (the stop travels
    in a round's sums, so every rank sees it in the same round and starts no other): a
    stalled rank on the second virtual node must not change that."""
    run_dir = tmp_path / "run"
    proc = run(run_dir, *FAST_FLAGS, "--total-steps", "3000")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["env_steps"] >= 3000 and s["learner_params_identical"]
