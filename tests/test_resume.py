"""Preemption and resume through the real entry point: SIGTERM to mpiexec makes every
rank checkpoint and exit 75 (work left); --resume continues counters, parameters and
replay, and a run that finishes its budget exits 0."""

import json
import os
import re
import signal
import subprocess
import time

import h5py
import numpy as np
import pytest

from conftest import ROOT, STOP_SIGNAL, mpi_env, pal_cmd, rank_processes
from pal_hpc.io.checkpoint import list_checkpoints
from pal_hpc.io.metrics import read_run_metrics

pytestmark = pytest.mark.mpi

main_cmd = pal_cmd          # FAST_FLAGS, --run-dir, then the test's flags
env = mpi_env


def summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def run(cmd, timeout=180):
    return subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout)


def preempted_run(run_dir):
    """Start a long run, signal the launcher once training is under way (SIGTERM;
    SIGUSR1 under Open MPI, whose mpiexec kills the ranks on SIGTERM)."""
    proc = subprocess.Popen(main_cmd(4, run_dir, "--total-steps", "10000000"), cwd=ROOT,
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    lines = []
    for line in proc.stdout:                 # wait for two progress lines
        lines.append(line)
        if sum("updates" in ln for ln in lines) >= 2 or time.monotonic() > deadline:
            break
    proc.send_signal(STOP_SIGNAL)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, "".join(lines) + out, err


def test_sigterm_checkpoints_then_resume_carries_on(tmp_path):
    run_dir = tmp_path / "run"
    code, out, err = preempted_run(run_dir)
    assert code == 75, out + err
    first = summary(run_dir)
    assert STOP_SIGNAL.name in first["stop_reason"]
    assert first["work_left"] is True and first["exit_status"] == 75
    # A preempted job checkpoints and exits; its final evaluation waits for the real end.
    assert first["final_eval_return"] is None
    ckpt_path = first["checkpoint"]
    with h5py.File(ckpt_path, "r") as f:
        saved_digest = f.attrs["params_digest"]
        assert f.attrs["updates"] == first["updates"] > 0
    assert first["env_steps"] > 1000

    more = first["env_steps"] + 2000
    proc = run(main_cmd(4, run_dir, "--resume", "latest", "--total-steps", str(more)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    second = summary(run_dir)
    assert second["resumed_from"] == ckpt_path
    assert second["params_digest_at_start"] == saved_digest       # bit-identical restore
    assert second["replay_size_at_start"] == min(first["env_steps"], 20000) or \
        second["replay_size_at_start"] > 0.9 * min(first["env_steps"], 20000)
    assert second["env_steps"] >= more                            # counters continued
    assert second["updates"] > first["updates"]
    assert second["wall_s"] > first["wall_s"]
    assert second["learner_params_identical"]
    assert second["work_left"] is False and second["exit_status"] == 0
    assert second["final_eval_return"] is not None
    # The learner profile is per update of the process that made it: a resumed run's
    # seconds over its own updates, not over the restored count as well.
    assert first["learner_profile_updates"] == first["updates"]
    assert second["learner_profile_updates"] == second["updates"] - first["updates"] > 0
    for p in second["learner_profile"]:
        profiled_s = p["wall_per_update"] * second["learner_profile_updates"] / 1e3
        assert profiled_s <= second["wall_s"] - first["wall_s"] + 0.5, (p, first, second)
    # The log goes on from the checkpoint: no learner row of the resumed run counts its
    # env steps from 0 again (rows written before its first counter round could).
    steps = read_run_metrics(run_dir)["learner"]["env_step"]
    assert (np.diff(steps) >= 0).all() and steps.max() > first["env_steps"]


def test_resume_refuses_other_shapes_and_skips_corrupt(tmp_path):
    run_dir = tmp_path / "run"
    proc = run(main_cmd(2, run_dir, "--total-steps", "1500"))
    assert proc.returncode == 0, proc.stderr
    proc = run(main_cmd(2, run_dir, "--total-steps", "3000", "--resume", "latest"))
    assert proc.returncode == 0, proc.stderr
    good, newest = summary(run_dir)["resumed_from"], summary(run_dir)["checkpoint"]

    refused = run([*main_cmd(2, run_dir, "--total-steps", "5000", "--resume", "latest"),
                   "--hidden", "64", "64"])
    assert refused.returncode == 2
    assert "hidden" in refused.stderr and refused.stderr.count("invalid configuration") == 1

    with open(newest, "r+b") as fh:            # truncate the newest checkpoint
        fh.truncate(400)
    proc = run(main_cmd(2, run_dir, "--total-steps", "4000", "--resume", "latest"))
    assert proc.returncode == 0, proc.stderr
    assert "warning" in proc.stdout and "skipping checkpoint" in proc.stdout
    assert summary(run_dir)["resumed_from"] == good


def test_resume_auto_starts_fresh_then_resumes(tmp_path):
    """What a requeued SLURM job does: the same command line twice."""
    run_dir = tmp_path / "run"
    first = run(main_cmd(2, run_dir, "--total-steps", "1500", "--resume", "auto"))
    assert first.returncode == 0, first.stderr
    assert summary(run_dir)["resumed_from"] is None
    second = run(main_cmd(2, run_dir, "--total-steps", "3000", "--resume", "auto"))
    assert second.returncode == 0, second.stderr
    assert summary(run_dir)["resumed_from"] is not None
    assert summary(run_dir)["env_steps"] >= 3000
    # --wall-time counts the run's time across resumes: a budget the run has already
    # used says so at the resume, and the run stops at its first check, checkpointed.
    used = summary(run_dir)["wall_s"]
    third = run(main_cmd(2, run_dir, "--total-steps", "100000", "--resume", "auto",
                         "--wall-time", f"{used / 2:.3f}"))
    assert third.returncode == 0, third.stderr
    m = re.search(r"warning: --wall-time (\S+) counts the run's wall time across resumes, "
                  r"and ([\d,.]+) s of it are used", third.stdout)
    assert m, third.stdout
    assert float(m[1]) == float(f"{used / 2:.3f}")
    assert used / 2 <= float(m[2].replace(",", "")) <= used + 0.05     # the checkpoint's
    assert summary(run_dir)["stop_reason"].startswith("wall time"), summary(run_dir)
    assert summary(run_dir)["env_steps"] < 100000


def test_periodic_checkpoints_and_a_clean_resume(tmp_path):
    """--checkpoint-every writes checkpoints while training (learners pause after the
    same step); a resumed run does not replay the old run's checkpoint requests."""
    run_dir = tmp_path / "run"
    # A wall-time budget, not a step budget: how many half-seconds a run of N steps
    # lasts depends on the machine and the code's speed (6,000 CartPole steps once lasted
    # over a second here, and then under one).
    proc = run(main_cmd(2, run_dir, "--total-steps", "10000000", "--wall-time", "3",
                        "--checkpoint-every", "0.5", "--keep-checkpoints", "100"))
    assert proc.returncode == 0, proc.stderr
    first = list_checkpoints(run_dir)
    assert len(first) >= 3                       # several mid-run ones, and the final one
    steps = summary(run_dir)["env_steps"]
    proc = run(main_cmd(2, run_dir, "--total-steps", str(steps + 2000), "--resume", "latest",
                        "--keep-checkpoints", "100"))
    assert proc.returncode == 0, proc.stderr
    second = list_checkpoints(run_dir)
    assert len(second) == len(first) + 1         # only the resumed run's final checkpoint
    assert summary(run_dir)["learner_params_identical"]


def test_a_default_run_checkpoints_every_half_hour(monkeypatch):
    """Without --checkpoint-every a long job still checkpoints while training, so a lost
    node (which gets no signal) costs at most half an hour; 0 turns it off."""
    from pal_hpc.config import Config
    from pal_hpc.runtime import coordinator

    now = [1000.0]
    monkeypatch.setattr(coordinator.time, "monotonic", lambda: now[0])
    coord = coordinator.Coordinator(Config(), now[0])
    due = []
    for _ in range(2 * 3600 // 60):              # two hours in one-minute rounds
        now[0] += 60.0
        due.append(coord.checkpoint_due())
    assert sum(due) == 4 and due[29] and due[59], [i for i, d in enumerate(due) if d]
    off = coordinator.Coordinator(Config(checkpoint_every=0.0), now[0])
    now[0] += 1e6
    assert not off.checkpoint_due()


@pytest.mark.parametrize("steps, wall_time, work_left", [
    (400, 0.0, True),          # signalled with steps to go: exit 75, resume to continue
    (1000, 0.0, False),        # the step budget got done as the signal came: exit 0
    (400, 1e-9, False),        # the wall budget is used up: exit 0
])
def test_a_signal_means_work_left_only_while_the_budget_is_not_done(steps, wall_time,
                                                                     work_left):
    from pal_hpc.config import Config
    from pal_hpc.runtime import stats as S
    from pal_hpc.runtime.coordinator import Coordinator

    cfg = Config(total_steps=1000, wall_time=wall_time, progress_every=1e9)
    coord = Coordinator(cfg, time.monotonic())
    total = np.zeros(S.SIZE)
    total[S.ENV_STEPS], total[S.PREEMPT] = steps, 1
    assert coord.observe(total)
    assert coord.work_left is work_left, coord.stop_reason
    assert ("exit status 75" in coord.stop_reason) is work_left, coord.stop_reason


def test_sigterm_twice_to_every_rank_is_one_checkpoint_and_exit_75(tmp_path):
    """Under SLURM a rank may get SIGTERM twice (slurmd signals every process of the step,
    and a launcher may pass it on): still one checkpoint, one summary, exit 75."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(main_cmd(2, run_dir, "--total-steps", "10000000"), cwd=ROOT,
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 120
        for line in proc.stdout:                 # training is under way
            lines.append(line)
            if "updates" in line or time.monotonic() > deadline:
                break
        _, ranks = rank_processes(proc.pid)
        assert len(ranks) == 2, ranks
        for gap in (0.0, 0.3):                   # the second lands while they wind down
            time.sleep(gap)
            for pid in ranks:
                os.kill(pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    out = "".join(lines) + out
    assert proc.returncode == 75, out + err
    assert out.count("summary: ") == 1 and "Traceback" not in err, out + err
    mains = [p for p in (run_dir / "checkpoints").glob("step_*.h5") if "_replay" not in p.name]
    assert len(mains) == 1, mains
    assert "SIGTERM" in summary(run_dir)["stop_reason"]
