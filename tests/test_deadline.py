"""The deadline on waits for other ranks (`--peer-timeout`, pal_hpc.cluster.deadline) on
one host: the probes themselves, a frozen rank (SIGSTOP: alive to the kernel, silent to
everyone) that ends the job naming it, and a slow rank that does not.

What the deadline is for -- a host lost or cut off -- is shown across test hosts in
tests/test_multihost.py; these runs need no root.
"""

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import ROOT, mpi_env, pal_cmd, rank_processes
from pal_hpc.cluster import liveness
from pal_hpc.cluster.deadline import PEER_LOST_EXIT

LONG = ["--total-steps", "10000000"]


def test_a_responder_answers_with_its_whereabouts_and_a_closed_one_does_not():
    ops = [["Iallreduce", "pal_hpc/runtime/learner.py:234 _run_phase", 3.5, False]]
    first = liveness.Responder(7, "hostA", describe=lambda: ops, address="127.0.0.1")
    second = liveness.Responder(8, "hostB", address="127.0.0.1")
    try:
        answers = liveness.probe([(7, "127.0.0.1", first.port), (8, "127.0.0.1", second.port)],
                                 wait=2.0)
        assert set(answers) == {7, 8}
        assert answers[7]["host"] == "hostA" and answers[7]["ops"] == ops
        assert answers[8]["ops"] == [] and ":" in answers[8]["where"]
        second.close()
        t0 = time.monotonic()
        answers = liveness.probe([(7, "127.0.0.1", first.port), (8, "127.0.0.1", second.port)],
                                 wait=1.0)
        assert set(answers) == {7}
        assert time.monotonic() - t0 < 2.0
    finally:
        first.close()
        second.close()


def test_an_answer_fits_one_datagram_however_many_operations_are_open():
    ops = [["Iallreduce", "x" * 200, 1.0, False]] * 50
    responder = liveness.Responder(0, "h", describe=lambda: ops, address="127.0.0.1")
    try:
        answer = liveness.probe([(0, "127.0.0.1", responder.port)])[0]
        assert 0 < len(answer["ops"]) < 50
        assert len(json.dumps(answer)) <= liveness.MAX_ANSWER
    finally:
        responder.close()


@pytest.mark.mpi
def test_a_frozen_rank_ends_the_job_within_the_deadline_naming_it(tmp_path):
    """SIGSTOP freezes rank 2 (an actor) with its responder: the others' counter round
    cannot complete, the probe gets no answer, and the job ends with PEER_LOST_EXIT."""
    timeout = 6
    cmd = pal_cmd(3, tmp_path / "run", *LONG, "--peer-timeout", str(timeout))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        ranks = _wait_for_ranks(proc.pid, 3)
        _wait_for(tmp_path / "run" / "metrics.h5")
        time.sleep(2)                           # into training
        os.kill(_world_rank_pid(ranks, 2), signal.SIGSTOP)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=timeout + 30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == PEER_LOST_EXIT, err[-3000:]
    assert took < timeout + 15, f"the job took {took:.1f} s to end after the freeze"
    lines = [ln for ln in err.splitlines() if "did not complete" in ln]
    assert lines, err[-3000:]
    assert all("(rank 2)" in ln or "ranks 2" in ln or ", 2" in ln for ln in lines), lines
    assert all(f"--peer-timeout {timeout}" in ln for ln in lines), lines


@pytest.mark.mpi
def test_a_slow_rank_that_answers_only_extends_the_wait(tmp_path):
    """Rank 0 sleeps 9 s once (in its loop) with --peer-timeout 5: the other ranks'
    counter rounds wait past the deadline, the probes find it alive, and the run ends
    normally."""
    cmd = pal_cmd(3, tmp_path / "run", "--total-steps", "3000", "--peer-timeout", "5")
    res = subprocess.run(cmd, cwd=ROOT, env=mpi_env(PAL_HPC_INJECT_STALL="0:9"),
                         capture_output=True, text=True, timeout=150)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "did not complete" not in res.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["exit_status"] == 0 and summary["env_steps"] >= 3000


def test_a_peer_timeout_below_the_minimum_is_refused(tmp_path):
    res = subprocess.run(pal_cmd(1, tmp_path / "run", "--peer-timeout", "2"), cwd=ROOT,
                         env=mpi_env(), capture_output=True, text=True, timeout=90)
    assert res.returncode == 2
    assert "peer_timeout: must be 0 (no deadline) or >= 5 seconds" in res.stderr


def _wait_for_ranks(mpiexec_pid: int, n: int, timeout: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, ranks = rank_processes(mpiexec_pid)
        if len(ranks) == n:
            return ranks
        time.sleep(0.05)
    raise AssertionError("the ranks did not start")


def _wait_for(path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.1)


def _world_rank_pid(pids: list[int], rank: int) -> int:
    for pid in pids:
        environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        for item in environ:
            if item in (f"PMI_RANK={rank}".encode(), f"OMPI_COMM_WORLD_RANK={rank}".encode()):
                return pid
    raise AssertionError(f"no process of rank {rank} among {pids}")


def test_a_checkpoint_write_near_the_deadline_is_warned_about_once(tmp_path, capsys,
                                                                    monkeypatch):
    from pal_hpc.cluster import watched
    from pal_hpc.io import checkpoint as ckpt

    monkeypatch.setattr(watched, "TIMEOUT", [1e-9])     # any write takes longer
    monkeypatch.setattr(ckpt, "_warned_slow", False)
    for i in range(2):
        ckpt.write_atomic(tmp_path / f"step_{i}.h5", lambda f: f.attrs.update(x=1))
    err = capsys.readouterr().err
    assert err.count("over half of --peer-timeout") == 1 and "step_0.h5" in err
    monkeypatch.setattr(watched, "TIMEOUT", [0.0])      # no deadline: no warning
    monkeypatch.setattr(ckpt, "_warned_slow", False)
    ckpt.write_atomic(tmp_path / "step_2.h5", lambda f: f.attrs.update(x=1))
    assert "peer-timeout" not in capsys.readouterr().err


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 3])
def test_every_communicator_derived_from_the_world_knows_its_members(mpi, nprocs):
    """Dup (mpi4py keeps the caller's class), Split, Split_type, Create, Create_group:
    each is watched and knows its members' world ranks, which the deadline probes."""
    res = mpi(nprocs, ROOT / "tests" / "mpi" / "watched_comms.py", "members", timeout=60)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("derived communicators know their members") == nprocs


@pytest.mark.mpi
def test_a_frozen_peer_ends_a_wait_on_a_duplicated_communicator(mpi):
    """The checkpoint's barriers run on a Dup of the world.  When a Dup knew no members,
    its waits had no one to probe and were taken for a slow peer: rank 0 waited ten
    deadlines (34 s here with a 3 s deadline) and an actor in a checkpoint's barrier
    outlived a partition.  Now the frozen rank is named after one deadline."""
    timeout = 3
    t0 = time.monotonic()
    res = mpi(2, ROOT / "tests" / "mpi" / "watched_comms.py", "frozen-dup", str(timeout),
              timeout=90)
    took = time.monotonic() - t0
    assert res.returncode == PEER_LOST_EXIT, res.stderr[-3000:]
    assert "the barrier completed" not in res.stdout
    lines = [ln for ln in res.stderr.splitlines() if "did not complete" in ln]
    assert lines and all("no answer from host" in ln and "(rank 1)" in ln for ln in lines), \
        res.stderr[-3000:]
    assert took < 30, f"the job took {took:.1f} s to end"
