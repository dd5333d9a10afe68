"""jobs/multi_node.sbatch across hosts that share nothing but their links: the
throw-away SLURM of tests/slurm_cluster.py with one slurmd inside each of two test
hosts (pal_hpc.cluster.testhosts: each its own network, hostname, IPC, PID and
/dev/shm), so `sbatch --nodes=2` puts each node's ranks on its own host and the job's
gradients and counters cross the veth links.  The script as written, with small
overrides only (as tests/test_slurm.py): it trains across both hosts; every rank on one
host is killed (a lost node), the launcher ends the attempt at once, the script
requeues the job under the same job id, and it resumes across both hosts from a
checkpoint that verifies; `scancel -s TERM` then checkpoints it across both hosts.
(The requeue after `scancel -s TERM` and at the time limit: tests/test_slurm.py.)

Needs root (SLURM, namespaces): skips where either cannot be made, saying why, and
fails instead under PAL_REQUIRE_SLURM=1 or PAL_REQUIRE_TESTHOSTS=1 (CI)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pal_hpc.cluster.testhosts import TestHosts, unavailable
from pal_hpc.io import checkpoint as ckpt
from pal_hpc.runtime.signals import WORK_LEFT_EXIT
from slurm_cluster import SlurmCluster, SlurmUnavailable, ensure_installed
from test_slurm import Job, _no_jobs_left  # noqa: F401  (the autouse fixture)

pytestmark = pytest.mark.mpi


def _unavailable_here(why: str, flag: str) -> None:
    if os.environ.get(flag) == "1":
        pytest.fail(f"{flag}=1 but {why}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def cluster():
    """Two test hosts, a slurmd on each, slurmctld here; all gone after the module."""
    try:
        ensure_installed()
    except SlurmUnavailable as exc:
        _unavailable_here(str(exc), "PAL_REQUIRE_SLURM")
    why = unavailable()
    if why:
        _unavailable_here(why, "PAL_REQUIRE_TESTHOSTS")
    with TestHosts(2, tag="s") as hosts, SlurmCluster(hosts=hosts) as c:
        yield c


def test_a_job_across_two_hosts_requeues_after_a_lost_node_and_resumes_there(cluster, tmp_path):
    hosts = cluster.hosts
    job = Job(cluster, tmp_path, "multi_node.sbatch", "--nodes=2", "--ntasks-per-node=2",
              args=("--learners-per-node", "1", "--total-steps", "100000000",
                    "--checkpoint-every", "1"))
    job.wait_training(restarts=0, timeout=150)
    info = job.state()
    assert info["NodeList"] == f"{hosts.prefix}h[1-2]", info
    # The second host's ranks talk to the first's over its link while training: its
    # counters grow by 100 kB (gradients, counters) within a minute of training.  How
    # fast depends on the machine's load, so the test waits for the bytes, not a time.
    start = hosts.link_bytes(hosts.names[1])
    deadline = time.monotonic() + 60
    while ((not ckpt.list_checkpoints(job.run_dir)
            or hosts.link_bytes(hosts.names[1]) - start <= 100_000)
           and time.monotonic() < deadline):
        time.sleep(0.5)
    assert hosts.link_bytes(hosts.names[1]) - start > 100_000
    saved = ckpt.latest_valid(job.run_dir)          # raises if none verifies

    # A lost node: every rank on the second host killed.  The launcher ends the
    # attempt at once; the script requeues the job (same id) as a lost node, and it
    # resumes on both hosts from a checkpoint that verifies.
    lost = hosts.names[1]
    assert hosts.kill(lost, "pal_hpc.main"), "no rank on the second host to kill"
    job.wait_training(restarts=1, timeout=150)
    info = job.state()
    assert info["JobState"] == "RUNNING" and info["Restarts"] == "1", info
    assert info["NodeList"] == f"{hosts.prefix}h[1-2]", info
    first, second = job.output.split("pal_hpc: job ")[1:3]
    assert f"RUNNING AT {lost}" in first, first
    assert "lost a node (exit status" in first and "requeueing job" in first, first
    assert "resumed from " in second and "(4 ranks on 2 node(s))" in second, second
    # The newest that verified when the attempt began (a resume verifies first).
    resumed = Path(second.split("resumed from ")[1].split(" (")[0])
    assert ckpt.step_of(resumed) >= ckpt.step_of(saved), (resumed, saved)

    # scancel -s TERM: the ranks checkpoint across both hosts (exit 75; the script
    # would requeue it again), then a plain scancel ends the job.
    t0 = time.time()
    cluster.cmd("scancel", "-s", "TERM", str(job.id))
    last = job.wait_summary(t0, 120, "no summary after scancel -s TERM")
    assert last["exit_status"] == WORK_LEFT_EXIT and last["resumed_from"] == str(resumed), last
    assert last["nodes"] == 2 and last["hosts"] == hosts.names, last
    assert last["learners"] == 2 and last["learner_params_identical"] is True, last
    # The script requeues it (restart 2); once SLURM has counted that restart, a plain
    # scancel ends the job for good.  Sent sooner, it can be undone: a `scontrol requeue`
    # still on its way brings back a job that was cancelled meanwhile.
    job.wait(lambda j: j["Restarts"] == "2", 60, "not requeued after exit 75")
    cluster.cmd("scancel", str(job.id))
    info = job.wait_final(timeout=60)
    assert info["JobState"] == "CANCELLED", (info, job.output)
