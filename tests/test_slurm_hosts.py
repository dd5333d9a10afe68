"""jobs/multi_node.sbatch across hosts that share nothing but their links: the
throw-away SLURM of tests/slurm_cluster.py with one slurmd inside each of two test
hosts (pal_hpc.cluster.testhosts: each its own network, hostname, IPC, PID and
/dev/shm), so `sbatch --nodes=2` puts each node's ranks on its own host and the job's
gradients and counters cross the veth links.  The script as written, with small
overrides only (as tests/test_slurm.py): it trains across both hosts, `scancel -s TERM`
checkpoints it (exit 75), it requeues itself under the same job id and resumes across
the hosts again; then every rank on one host is killed (a lost node): the launcher
ends the attempt at once, and the script requeues it and it resumes again.

Needs root (SLURM, namespaces): skips where either cannot be made, saying why, and
fails instead under PAL_REQUIRE_SLURM=1 or PAL_REQUIRE_TESTHOSTS=1 (CI)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pal_hpc.cluster.testhosts import TestHosts, unavailable
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
    with TestHosts(2, tag="s") as hosts:
        c = SlurmCluster(hosts=hosts)
        try:
            c.start()
            yield c
        finally:
            c.stop()
            c.remove()


def test_a_job_across_two_hosts_requeues_after_a_signal_and_after_a_lost_node(cluster, tmp_path):
    hosts = cluster.hosts
    job = Job(cluster, tmp_path, "multi_node.sbatch", "--nodes=2", "--ntasks-per-node=2",
              args=("--learners-per-node", "1", "--total-steps", "100000000"))
    job.wait_training(restarts=0, timeout=150)
    info = job.state()
    assert info["NodeList"] == f"{hosts.prefix}h[1-2]", info
    crossed = hosts.link_bytes(hosts.names[1])
    time.sleep(2)
    # The second host's ranks talk to the first's over its link while training.
    assert hosts.link_bytes(hosts.names[1]) - crossed > 100_000

    t0 = time.time()
    cluster.cmd("scancel", "-s", "TERM", str(job.id))
    first = job.wait_summary(t0, 120, "no summary after scancel -s TERM")
    assert first["exit_status"] == WORK_LEFT_EXIT and first["work_left"] is True, first
    assert first["nodes"] == 2 and first["hosts"] == hosts.names, first
    assert first["learners"] == 2 and first["learner_params_identical"] is True, first
    assert first["checkpoint"] and Path(first["checkpoint"]).exists(), first

    job.wait_training(restarts=1, timeout=150)   # requeued, on both hosts again
    info = job.state()
    assert info["JobState"] == "RUNNING" and info["Restarts"] == "1", info
    assert info["NodeList"] == f"{hosts.prefix}h[1-2]", info
    assert f"resumed from {first['checkpoint']}" in job.output, job.output
    assert job.output.count("(4 ranks on 2 node(s))") == 2, job.output

    # A lost node: every rank on the second host killed.  The launcher ends the
    # attempt, the script requeues it as a lost node, and it resumes on both hosts.
    lost = hosts.names[1]
    assert hosts.kill(lost, "pal_hpc.main"), "no rank on the second host to kill"
    job.wait_training(restarts=2, timeout=150)
    info = job.state()
    assert info["JobState"] == "RUNNING" and info["Restarts"] == "2", info
    out = job.output
    assert "lost a node (exit status" in out and f"RUNNING AT {lost}" in out, out
    assert "requeueing job" in out.split("pal_hpc: job ")[2], out
    third = out.split("pal_hpc: job ")[3]
    assert "resumed from " in third and "(4 ranks on 2 node(s))" in third, third
    cluster.cmd("scancel", str(job.id))
    info = job.wait_final(timeout=60)
    assert info["JobState"] == "CANCELLED", (info, job.output)
