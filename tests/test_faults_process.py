"""Nothing lost, nothing hung: how the real job ends when a process-level thing goes wrong.

A rejection found on some ranks only, an unknown flag, Ctrl-C (once and twice), an abort
(no /dev/shm file left behind) and a launcher killed under the ranks.  Every job runs
under the venv's mpiexec with an outer timeout; the process helpers read /proc.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import ROOT, VENDOR, mpi_env, mpiexec, pal_cmd, rank_processes
from pal_hpc.runtime import lifeline
from pal_hpc.runtime.signals import WORK_LEFT_EXIT

pytestmark = pytest.mark.mpi

LONG = ["--total-steps", "10000000"]


def run(cmd, timeout=90, **extra_env):
    try:
        return subprocess.run(cmd, cwd=ROOT, env=mpi_env(**extra_env), capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(map(str, cmd))} hung for {timeout}s:\n{exc.stderr or ''}")


def alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def ranks_of(mpiexec_pid: int, n: int, timeout: float = 60) -> tuple[int, list[int]]:
    """(the ranks' parent: hydra_pmi_proxy, or Open MPI's mpiexec, and the rank pids)
    once all `n` ranks are up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        parent, ranks = rank_processes(mpiexec_pid)
        if len(ranks) == n:
            return parent, ranks
        time.sleep(0.05)
    raise AssertionError("the ranks did not start")


def start(cmd, **extra_env) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(**extra_env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_training(proc: subprocess.Popen, lines: list[str], timeout: float = 120) -> None:
    """Read stdout until two progress lines showed updates (training is under way)."""
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        lines.append(line)
        if sum("updates" in ln for ln in lines) >= 2 or time.monotonic() > deadline:
            return


def kill_all(proc: subprocess.Popen, pids=()) -> None:
    """Leave nothing running: the job's processes we know of, then mpiexec."""
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


# -- item 7: rejections on some ranks only ---------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu_ends_the_job_with_one_message(tmp_path):
    """Only the learner finds it (pick_device); the actor waits in a collective."""
    t0 = time.monotonic()
    proc = run(pal_cmd(2, tmp_path / "run", "--device", "cuda"), timeout=60)
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("pal_hpc: invalid configuration: device: cuda") == 1, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("ranks", ["1", "all"])
def test_late_rejection_on_some_or_all_ranks_ends_the_job(tmp_path, ranks):
    """Rank 1 alone rejects while ranks 0 and 2 wait for it in training's collectives;
    or every rank rejects, which prints the message once.  Uneven virtual nodes
    (3 ranks, 2 per node) are said so on the way."""
    t0 = time.monotonic()
    proc = run(pal_cmd(3, tmp_path / "run", "--ranks-per-node", "2"), timeout=60,
               PAL_HPC_INJECT_CONFIG_ERROR=ranks)
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("pal_hpc: invalid configuration: device: injected") == 1, \
        proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.count("uneven virtual nodes of 2 + 1 ranks") == 1, proc.stdout


# -- item 17b: an unknown flag -----------------------------------------------------------

def test_unknown_flag_prints_usage_once_and_exits_2(tmp_path):
    proc = run(pal_cmd(3, tmp_path / "run", "--no-such-flag", fast=False), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("usage:") == 1, proc.stderr
    assert proc.stderr.count("unrecognized arguments: --no-such-flag") == 1


# -- item 13: Ctrl-C ------------------------------------------------------------------

def test_one_sigint_to_mpiexec_checkpoints_and_exits_work_left(tmp_path):
    """hydra's mpiexec forwards a first SIGINT to every rank: like SIGTERM (checkpoint,
    then exit 75 since the step budget is far from used up).  Open MPI's kills the
    ranks on SIGINT (see the next test); its SIGUSR1 is the forwarded one."""
    run_dir = tmp_path / "run"
    proc = start(pal_cmd(2, run_dir, *LONG))
    lines: list[str] = []
    sig = signal.SIGUSR1 if VENDOR == "openmpi" else signal.SIGINT
    try:
        wait_for_training(proc, lines)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=90)
    finally:
        kill_all(proc)
    assert proc.returncode == WORK_LEFT_EXIT == 75, "".join(lines) + out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "Abort" not in out + err, out + err          # a clean stop, not MPI_Abort
    assert list((run_dir / "checkpoints").glob("*.h5")), list(run_dir.rglob("*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert sig.name in summary["stop_reason"], summary["stop_reason"]
    assert summary["work_left"] is True and summary["exit_status"] == 75, summary


@pytest.mark.skipif(VENDOR != "openmpi", reason="Open MPI's launcher's own behaviour")
def test_sigint_or_sigterm_to_open_mpis_mpiexec_ends_the_job_at_once(tmp_path):
    """Open MPI's mpiexec answers SIGINT and SIGTERM by killing the ranks itself (no
    checkpoint is possible): the job still ends promptly, nonzero, no rank left."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        proc = start(pal_cmd(2, tmp_path / sig.name, *LONG))
        ranks: list[int] = []
        try:
            wait_for_training(proc, [])
            _, ranks = ranks_of(proc.pid, 2)
            proc.send_signal(sig)
            proc.communicate(timeout=30)
            deadline = time.monotonic() + 10
            while any(alive(p) for p in ranks) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            kill_all(proc, ranks)
        assert proc.returncode not in (0, WORK_LEFT_EXIT), (sig, proc.returncode)
        assert not [p for p in ranks if alive(p)], sig


def test_second_sigint_to_a_rank_stops_at_once_in_one_line():
    """A rank that gets SIGINT twice (not through the launcher, which would kill the
    ranks itself on a second Ctrl-C) aborts the job with 130 and no traceback."""
    script = ("import os, signal, time; from pal_hpc.runtime import signals; "
              "signals.install(); from mpi4py import MPI; MPI.COMM_WORLD.Barrier(); "
              "r = MPI.COMM_WORLD.Get_rank(); "
              "r == 1 and os.kill(os.getpid(), signal.SIGINT); time.sleep(0.2); "
              "print(f'rank{r}={signals.requested or None}', flush=True); MPI.COMM_WORLD.Barrier(); "
              "r == 1 and os.kill(os.getpid(), signal.SIGINT); time.sleep(30)")
    t0 = time.monotonic()
    proc = run(mpiexec(2, "-c", script))
    assert time.monotonic() - t0 < 20
    assert proc.returncode == 130, proc.stdout + proc.stderr
    assert "rank1=SIGINT" in proc.stdout and "rank0=None" in proc.stdout   # rank 1 alone
    assert proc.stderr.count("second SIGINT") == 1, proc.stderr
    assert "Traceback" not in proc.stderr


# -- item 15: an abort leaves no /dev/shm file ----------------------------------------

def test_abort_leaves_no_shared_memory_files(tmp_path):
    """Record the /dev/shm files the ranks map while the job runs; after the injected
    fault aborts it, none of them may remain."""
    proc = start(pal_cmd(2, tmp_path / "run", *LONG), PAL_HPC_INJECT_FAULT="1:2")
    ranks: list[int] = []
    try:
        _, ranks = ranks_of(proc.pid, 2)
        mapped: set[str] = set()
        deadline = time.monotonic() + 60
        while len(mapped) == 0 and time.monotonic() < deadline and proc.poll() is None:
            for pid in ranks:
                try:
                    mapped |= {p.removesuffix(" (deleted)") for p in _shm_maps(pid)}
                except OSError:
                    pass
            time.sleep(0.05)
        proc.communicate(timeout=90)
    finally:
        kill_all(proc, ranks)
    assert proc.returncode == 1                      # the injected fault's abort
    assert mapped, "never saw the ranks' intranode segment"
    assert not [p for p in mapped if os.path.exists(p)]


# The MPI library's own intranode files: MPICH's (unlinked by runtime.lifeline), Open
# MPI's btl/sm segments (removed by its launcher when the job ends), Intel MPI's
# (unlinked by itself once mapped).
SEGMENTS = ("/dev/shm/mpich_shm_", "/dev/shm/sm_segment.", "/dev/shm/Intel_MPI_")


def _shm_maps(pid: int) -> list[str]:
    with open(f"/proc/{pid}/maps") as fh:
        return [ln.split(maxsplit=5)[5].strip() for ln in fh
                if len(ln.split(maxsplit=5)) == 6
                and ln.split(maxsplit=5)[5].startswith(SEGMENTS)]


def test_mapped_segments_skips_deleted_and_other_files(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f54-7f55 rw-s 00000000 00:1b 11   /dev/shm/mpich_shm_f699660b_0\n"
        "7f55-7f56 rw-s 00000000 00:1b 11   /dev/shm/mpich_shm_f699660b_0\n"
        "7f56-7f57 rw-s 00000000 00:1b 12   /dev/shm/mpich_shar_tmpIkNTpD (deleted)\n"
        "7f57-7f58 rw-s 00000000 00:1b 7    /dev/shm/ucx_shm_posix_7edeb096\n"
        "7f58-7f59 r-xp 00000000 08:01 99   /usr/lib/libc.so.6\n"
        "7f59-7f5a rw-p 00000000 00:00 0 \n")
    assert lifeline.mapped_segments(str(maps)) == ["/dev/shm/mpich_shm_f699660b_0"]


# -- item 18: the launcher dies under the ranks -----------------------------------------

def test_ranks_die_with_their_launcher(tmp_path):
    """SIGKILL the ranks' parent (hydra_pmi_proxy, or Open MPI's mpiexec), as an OOM
    killer might: every rank is gone within 10 s and mpiexec returns."""
    proc = start(pal_cmd(2, tmp_path / "run", *LONG))
    ranks: list[int] = []
    try:
        wait_for_training(proc, [])
        proxy, ranks = ranks_of(proc.pid, 2)
        os.kill(proxy, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(alive(p) for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [p for p in ranks if alive(p)]
        proc.communicate(timeout=30)
    finally:
        kill_all(proc, ranks)
    assert not left, f"ranks {left} outlived their launcher"
    assert proc.returncode != 0


def test_a_rank_whose_launcher_died_before_the_tie_exits(tmp_path):
    """The race PR_SET_PDEATHSIG alone misses: the launcher died before the call."""
    code = ("import os, sys, time; from pal_hpc.runtime import lifeline\n"
            "if os.fork(): os._exit(0)\n"          # the 'launcher' exits at once
            "time.sleep(0.3)\n"
            "open(sys.argv[1] + '/ppid', 'w').write(str(os.getppid()))\n"
            "lifeline.tie_to_launcher()\n"
            "open(sys.argv[1] + '/survived', 'w').close()\n")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, timeout=30,
                   env=dict(os.environ, PMI_RANK="0"), check=True)
    deadline = time.monotonic() + 10
    while not _read(tmp_path / "ppid") and time.monotonic() < deadline:
        time.sleep(0.05)
    if _read(tmp_path / "ppid") != "1":
        pytest.skip("a sub-reaper, not init, adopted the orphan")
    time.sleep(1.0)
    assert not (tmp_path / "survived").exists()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def test_only_launched_ranks_tie_themselves():
    assert lifeline.under_launcher({"PMI_RANK": "0", "PMI_SIZE": "2"})
    assert not lifeline.under_launcher({"HOME": "/root"})
