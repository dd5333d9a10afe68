"""jobs/*.sbatch as written, under a real (throw-away) SLURM on this machine.

`tests/slurm_cluster.py` installs Debian's SLURM if needed and starts slurmctld with two
slurmd (nodes n1 and n2, 8 CPUs each, on this host).  The scripts run with small
overrides only: sbatch options (--ntasks-per-node, --time, --signal, --output) and
PAL_RUN_DIR.  Every wait has a timeout; the cluster is stopped (jobs cancelled, daemons
ended by PID) at the end of the module.

Where SLURM cannot be installed (not root, no package registry) these tests skip and say
why; with PAL_REQUIRE_SLURM=1 (set by .ci/run) they fail instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import FAST_FLAGS, ROOT
from pal_hpc.io.metrics import read_run_metrics
from pal_hpc.runtime.signals import WORK_LEFT_EXIT
from slurm_cluster import FINAL_STATES as FINAL
from slurm_cluster import SlurmCluster, SlurmUnavailable, ensure_installed

pytestmark = pytest.mark.mpi

RANKS = 4                       # per node; the test nodes advertise 8 CPUs each


@pytest.fixture(scope="module")
def cluster():
    """A running two-node SLURM, stopped (nothing left running) after the module."""
    try:
        ensure_installed()
    except SlurmUnavailable as exc:
        if os.environ.get("PAL_REQUIRE_SLURM") == "1":
            pytest.fail(f"PAL_REQUIRE_SLURM=1 but {exc}")
        pytest.skip(str(exc))
    with SlurmCluster() as c:
        yield c


@pytest.fixture(autouse=True)
def _no_jobs_left(request):
    """Each test starts and ends with an empty queue (a failed test leaves no job)."""
    yield
    if "cluster" in request.fixturenames:
        request.getfixturevalue("cluster").cancel_all()


class Job:
    """One submitted batch job: its id, run directory and output file."""

    def __init__(self, cluster: SlurmCluster, tmp_path: Path, script: str, *sbatch_opts: str,
                 args: tuple[str, ...] = (), fast: bool = True, env: dict | None = None):
        self.cluster = cluster
        self.run_dir = tmp_path / "run"
        self.out_pattern = tmp_path / "slurm-%j.out"
        self.id = cluster.sbatch(f"--output={self.out_pattern}",
                                 f"--ntasks-per-node={RANKS}", *sbatch_opts,
                                 f"jobs/{script}", *(FAST_FLAGS if fast else []), *args,
                                 cwd=ROOT, env=cluster.env(PAL_RUN_DIR=str(self.run_dir),
                                                           **(env or {})))

    @property
    def output(self) -> str:
        path = Path(str(self.out_pattern).replace("%j", str(self.id)))
        return path.read_text(errors="replace") if path.exists() else "(no output yet)"

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def state(self) -> dict:
        return self.cluster.job(self.id)

    def wait(self, until, timeout: float, what: str) -> dict:
        """Wait for `until(state)`; on timeout fail with the job's output and state."""
        try:
            return self.cluster.wait(self.id, until, timeout)
        except TimeoutError as exc:
            pytest.fail(f"{what}: {exc}\n--- job output ---\n{self.output}\n"
                        f"--- slurmctld ---\n{self.cluster.log('slurmctld')}")

    def wait_final(self, timeout: float) -> dict:
        return self.wait(lambda j: j["JobState"] in FINAL, timeout, "the job did not end")

    def wait_training(self, restarts: int, timeout: float) -> None:
        """Wait until attempt `restarts + 1` prints progress lines (it is training)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            attempts = self.output.split("pal_hpc: job ")
            if len(attempts) > restarts + 1 and \
                    attempts[restarts + 1].count("updates") >= 2:
                return
            info = self.state()
            if info["JobState"] in FINAL:
                pytest.fail(f"job ended ({info['JobState']}) before training:\n{self.output}")
            time.sleep(1)
        pytest.fail(f"attempt {restarts + 1} was not training within {timeout:.0f}s:\n"
                    f"{self.output}")

    def wait_summary(self, newer_than: float, timeout: float, what: str) -> dict:
        """The run's summary.json once one written after `newer_than` (a time.time())
        appears; fails after `timeout`, or at once if the job ends without one."""
        path = self.run_dir / "summary.json"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if path.stat().st_mtime > newer_than:
                    return json.loads(path.read_text())   # replaced atomically
            except FileNotFoundError:
                pass
            info = self.state()
            if info["JobState"] in FINAL:
                pytest.fail(f"{what}: the job ended ({info['JobState']}) without one:\n"
                            f"{self.output}")
            time.sleep(0.5)
        pytest.fail(f"{what} within {timeout:.0f}s:\n{self.output}")


def checkpoint_attrs(path: str) -> dict:
    """The root attributes of a checkpoint's main file."""
    with h5py.File(path, "r") as f:
        return {k: f.attrs[k] for k in f.attrs}


# -- 1 -------------------------------------------------------------------------------

def test_single_node_short_run_completes(cluster, tmp_path):
    job = Job(cluster, tmp_path, "single_node.sbatch", args=("--total-steps", "2000"))
    info = job.wait_final(timeout=240)
    out = job.output
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, out)
    assert info["Restarts"] == "0", out
    summary = job.summary()
    assert summary["env_steps"] >= 2000 and summary["ranks"] == RANKS, summary
    assert summary["exit_status"] == 0 and summary["work_left"] is False, summary
    assert summary["learner_params_identical"], summary
    assert "exit status 0: done; not requeueing" in out, out
    assert (job.run_dir / "config.json").exists()


# -- 1b: the ranks started by srun instead of the venv's mpiexec ----------------------

def test_single_node_run_under_srun_pmi2(cluster, tmp_path):
    """PAL_LAUNCHER=srun: SLURM starts the ranks itself (`srun --mpi=pmi2`; the MPICH
    wheel speaks PMI), they form one job and finish it."""
    job = Job(cluster, tmp_path, "single_node.sbatch", args=("--total-steps", "2000"),
              env={"PAL_LAUNCHER": "srun", "PAL_SRUN_MPI": "pmi2"})
    info = job.wait_final(timeout=240)
    out = job.output
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, out)
    summary = job.summary()
    assert summary["ranks"] == RANKS and summary["env_steps"] >= 2000, summary
    assert summary["learner_params_identical"] and summary["exit_status"] == 0, summary
    assert "exit status 0: done; not requeueing" in out, out


# -- 2 -------------------------------------------------------------------------------

@pytest.mark.slow
def test_time_limit_checkpoints_requeues_and_resumes_under_the_same_job_id(cluster, tmp_path):
    """A run far longer than --time=3: SLURM's SIGTERM about 120 s before the limit makes
    every rank checkpoint, the program exits 75 and the script requeues the job, which
    resumes from that checkpoint (same job id) and finishes its step budget.

    The budget comes from a --config file: far beyond the first attempt, then lowered to
    10,000 steps past the first attempt's checkpoint while the job waits in the queue, so
    the second attempt finishes however fast this machine is."""
    config = tmp_path / "budget.json"
    config.write_text(json.dumps({"total_steps": 100_000_000}))
    job = Job(cluster, tmp_path, "single_node.sbatch", "--time=3", "--signal=TERM@120",
              args=("--config", str(config)))
    t0 = time.time()
    first = job.wait_summary(t0, 170, "no summary from the first attempt (the time-limit "
                                      "SIGTERM comes 30-60 s into the job)")
    assert first["work_left"] is True and first["exit_status"] == WORK_LEFT_EXIT, first
    assert "SIGTERM" in first["stop_reason"], first
    assert 0 < first["env_steps"] < 100_000_000
    budget = first["env_steps"] + 10_000
    config.write_text(json.dumps({"total_steps": budget}))
    ckpt = checkpoint_attrs(first["checkpoint"])

    info = job.wait_final(timeout=240)
    out = job.output
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, out)
    restarts = int(info["Restarts"])
    assert restarts >= 1, out
    # One job id, one output file appended to by every attempt (--open-mode=append).
    for attempt in range(1, restarts + 2):
        assert f"pal_hpc: job {job.id} attempt {attempt} on " in out, out
    assert out.count("requeueing job") == restarts, out
    assert "exit status 0: done; not requeueing" in out, out

    final = job.summary()
    assert final["exit_status"] == 0 and final["work_left"] is False, final
    assert final["stop_reason"] == f"{budget} env steps done", final
    assert final["env_steps"] >= budget and final["learner_params_identical"], final
    if restarts == 1:                   # (a slow machine may have needed a third attempt)
        assert final["resumed_from"] == first["checkpoint"], final
        assert final["params_digest_at_start"] == ckpt["params_digest"], final
    assert final["updates"] > first["updates"] and final["wall_s"] > first["wall_s"]

    # The metrics log holds both attempts, and env steps go on across them.
    log = read_run_metrics(job.run_dir)
    assert len(log["attrs"]["resumes"]) == restarts, log["attrs"]
    steps, wall = log["learner"]["env_step"], log["learner"]["wall_s"]
    stop_steps = int(ckpt["env_steps"])
    assert (steps <= stop_steps).sum() > 0 and (steps > stop_steps).sum() > 0, \
        (stop_steps, steps.min(), steps.max())
    assert (np.diff(steps) >= 0).all() and (np.diff(wall) >= 0).all()
    assert steps.max() > stop_steps + 5_000


# -- 3 -------------------------------------------------------------------------------

@pytest.mark.slow
def test_scancel_term_requeues_then_plain_scancel_ends_the_job(cluster, tmp_path):
    """`scancel -s TERM` mid-run: checkpoint, exit 75, self-requeue and resume; then a
    plain `scancel` ends the job for good."""
    job = Job(cluster, tmp_path, "single_node.sbatch", args=("--total-steps", "100000000"))
    job.wait_training(restarts=0, timeout=120)
    t0 = time.time()
    cluster.cmd("scancel", "-s", "TERM", str(job.id))
    first = job.wait_summary(t0, 120, "no summary after scancel -s TERM")
    assert first["work_left"] is True and first["exit_status"] == WORK_LEFT_EXIT, first
    assert "SIGTERM" in first["stop_reason"], first
    assert first["checkpoint"] and Path(first["checkpoint"]).exists(), first

    job.wait_training(restarts=1, timeout=150)   # requeued, started again, training
    info = job.state()
    assert info["JobState"] == "RUNNING" and info["Restarts"] == "1", info
    assert f"resumed from {first['checkpoint']}" in job.output, job.output

    cluster.cmd("scancel", str(job.id))
    info = job.wait_final(timeout=60)
    assert info["JobState"] == "CANCELLED", (info, job.output)
    # Not requeued: still cancelled after a requeued job would have started again.
    time.sleep(20)
    info = job.state()
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "1", (info, job.output)
    assert job.output.count("requeueing job") == 1, job.output


# -- 4 -------------------------------------------------------------------------------

def test_multi_node_job_has_a_replay_per_node_and_identical_learners(cluster, tmp_path):
    job = Job(cluster, tmp_path, "multi_node.sbatch", "--nodes=2",
              args=("--learners-per-node", "1", "--total-steps", "3000"))
    info = job.wait_final(timeout=240)
    out = job.output
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, out)
    assert info["NodeList"] == "n[1-2]", info
    summary = job.summary()
    assert summary["nodes"] == 2 and summary["ranks"] == 2 * RANKS, summary
    assert summary["learners"] == 2 and summary["actors"] == 2 * (RANKS - 1), summary
    assert summary["learner_params_identical"] is True, summary
    assert summary["env_steps"] >= 3000 and summary["exit_status"] == 0, summary
    attrs = checkpoint_attrs(summary["checkpoint"])
    # One replay per node: each node's first rank saved its node's replay.
    assert len(json.loads(attrs["replay_files"])) == 2, attrs["replay_files"]
    layout = json.loads(attrs["layout"])                 # [node, is_actor, is_learner]
    assert sorted({node for node, _, learner in layout if learner}) == [0, 1], layout
    assert sorted({node for node, actor, _ in layout if actor}) == [0, 1], layout


# -- 5 -------------------------------------------------------------------------------

def test_gpu_script_is_accepted_and_fails_clearly_without_cuda(cluster, tmp_path):
    """SLURM accepts jobs/gpu.sbatch (the test nodes advertise two GPUs each, without
    CUDA behind them); on this machine the program then refuses --device cuda, naming
    the field, exits 2 and the script does not requeue."""
    import torch

    check = cluster.cmd("sbatch", "--test-only", f"--ntasks-per-node={RANKS}",
                        "jobs/gpu.sbatch", cwd=ROOT, check=False)
    assert check.returncode == 0 and "to start at" in check.stderr, check.stderr
    job = Job(cluster, tmp_path, "gpu.sbatch", args=("--total-steps", "2000"))
    info = job.wait_final(timeout=180)
    out = job.output
    if torch.cuda.is_available():       # a GPU machine: the script must train on it
        assert info["JobState"] == "COMPLETED", (info, out)
        return
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "2:0", (info, out)
    assert info["Restarts"] == "0", out
    # Found by the learners only (one line from each of them, at most), naming the field.
    errors = [ln for ln in out.splitlines() if "error" in ln.lower() or "invalid" in ln]
    assert errors and set(errors) == {"pal_hpc: invalid configuration: device: cuda requested "
                                      "but torch.cuda.is_available() is False"}, out
    assert "Traceback" not in out, out
    assert "exit status 2: failed; not requeueing" in out, out


# -- the script's decisions that need no SLURM ------------------------------------

def test_launch_script_refuses_an_unknown_launcher_and_names_the_venvs_mpi():
    """jobs/launch.sh: PAL_LAUNCHER other than srun/mpiexec fails with status 2, naming
    it, before anything starts; its vendor check agrees with pal_hpc's."""
    from pal_hpc.cluster.launch import launcher_vendor

    script = "source jobs/launch.sh; pal_launch true"
    proc = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PAL_LAUNCHER": "ssh",
                                           "SLURM_NTASKS": "2"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "PAL_LAUNCHER=ssh: expected srun or mpiexec" in proc.stderr, proc.stderr
    proc = subprocess.run(["bash", "-c", "source jobs/launch.sh; pal_mpi_vendor "
                           ".venv/bin/mpiexec"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.strip() == launcher_vendor(ROOT / ".venv" / "bin" / "mpiexec")


@pytest.mark.parametrize("status, summary, max_restarts, want_status, want_text", [
    (0, None, "50", 0, "exit status 0: done; not requeueing"),
    (2, None, "50", 2, "exit status 2: failed; not requeueing"),
    # hydra ORs the ranks' statuses: 75 without this attempt's summary saying so is
    # a failed rank, not work left.
    (75, None, "50", 1, "does not say work is left: a rank failed"),
    (75, {"exit_status": 1}, "50", 1, "does not say work is left: a rank failed"),
    (75, {"exit_status": 75}, "0", 75, "(PAL_MAX_RESTARTS=0); not requeueing"),
])
def test_requeue_script_decides_from_status_and_summary(tmp_path, status, summary,
                                                        max_restarts, want_status, want_text):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write = ""
    if summary is not None:         # the "program" writes its summary, then exits
        (tmp_path / "summary.json").write_text(json.dumps(summary))
        write = f"cp {tmp_path / 'summary.json'} {run_dir}/; "
    script = (f"source jobs/requeue.sh; pal_run_and_requeue {run_dir} "
              f"bash -c '{write}exit {status}'")
    proc = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PAL_MAX_RESTARTS": max_restarts,
                                           "SLURM_JOB_ID": "7"})
    assert proc.returncode == want_status, proc.stdout + proc.stderr
    assert want_text in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "requeueing job" not in proc.stdout


def _fake_scontrol(tmp_path) -> dict:
    """An environment whose `scontrol` only records its arguments (in tmp_path/calls)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "scontrol"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'calls'}\n")
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7"}


@pytest.mark.parametrize("case", ["deadline", "hydra killed", "open mpi killed", "crash",
                                  "old peer_lost.log"])
def test_requeue_script_requeues_a_lost_node_and_nothing_else(tmp_path, case):
    """A lost node (the ranks' deadline wrote peer_lost.log this attempt, or the
    launcher reports a rank killed by SIGKILL) is requeued; a crash is not, nor is a
    peer_lost.log that an earlier attempt wrote."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lost = run_dir / "peer_lost.log"
    if case == "old peer_lost.log":
        lost.write_text("pal_hpc: error: rank 0 (h1): ... no answer from host h2\n")
        os.utime(lost, (time.time() - 60, time.time() - 60))
    program = {
        "deadline": f"echo 'pal_hpc: error: rank 0 (h1): Iallreduce ... no answer from "
                    f"host h2 (ranks 2, 3)' >> {lost}; exit 76",
        "hydra killed": "printf '=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\\n"
                        "=   PID 40 RUNNING AT h2\\n=   EXIT CODE: 9\\n' >&2; exit 255",
        "open mpi killed": "echo 'prterun noticed that process rank 2 with PID 40 on node "
                           "h2 exited on signal 9 (Killed).' >&2; exit 137",
        "crash": "echo 'pal_hpc: rank 1 failed: Traceback ...' >&2; exit 1",
        "old peer_lost.log": "exit 1",
    }[case]
    (tmp_path / "program.sh").write_text(program + "\n")
    script = f"source jobs/requeue.sh; pal_run_and_requeue {run_dir} bash {tmp_path}/program.sh"
    proc = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=_fake_scontrol(tmp_path))
    out = proc.stdout + proc.stderr
    calls = (tmp_path / "calls").read_text() if (tmp_path / "calls").exists() else ""
    if case in ("crash", "old peer_lost.log"):
        assert proc.returncode == 1 and "failed; not requeueing" in out, out
        assert calls == "", calls
        return
    assert proc.returncode == 0, out
    assert calls == "requeue 7\n", calls
    assert "lost a node (exit status" in out and "requeueing job 7 (restart 1)" in out, out
    assert ("h2" in out) if case != "open mpi killed" else "SIGKILL" in out, out


def test_launch_script_ends_a_launcher_left_waiting_after_the_ranks_gave_up(tmp_path):
    """After a partition the ranks end at their deadline (a line in peer_lost.log) but
    hydra may wait on for the cut-off host: pal_launch ends it PAL_PEER_LOST_GRACE
    seconds after that line, and the job requeues as a lost node."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    launcher = tmp_path / "mpiexec"
    launcher.write_text(f"#!/bin/bash\n[ \"$1\" = --version ] && exit 0\nsleep 1\n"
                        f"echo 'pal_hpc: error: rank 0 (h1): no answer from host h2' "
                        f">> {run_dir / 'peer_lost.log'}\nexec sleep 300\n")
    launcher.chmod(0o755)
    script = (f"source jobs/requeue.sh; source jobs/launch.sh; "
              f"pal_run_and_requeue {run_dir} pal_launch true")
    env = {**_fake_scontrol(tmp_path), "PAL_MPIEXEC": str(launcher), "SLURM_NTASKS": "2",
           "PAL_PEER_LOST_GRACE": "2"}
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=env)
    took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert took < 20, (took, out)
    assert "launcher is still running 2 s later: ending it" in out, out
    assert "lost a node" in out and (tmp_path / "calls").read_text() == "requeue 7\n", out
