"""Run directories and checkpoints under faults, through the real entry point: nothing
an earlier run or another job wrote is lost, and a fault never hangs the job.

Each test names the fault it checks; the outer timeouts turn a hang into a failure."""

import json
import os
import shutil
import subprocess
import sys
import time

import h5py
import pytest

from conftest import ROOT, STOP_SIGNAL, mpi_env, pal_cmd
from pal_hpc.envs import make_env, obs_info
from pal_hpc.io import checkpoint as ckpt
from pal_hpc.replay import FrameStackReplay, SharedReplay
from pal_hpc.runtime.nstep import transition_spec
from pal_hpc.runtime.preflight import available_memory

pytestmark = pytest.mark.mpi


def run(cmd, timeout=180, **env):
    return subprocess.run(cmd, cwd=ROOT, env=mpi_env(**env), capture_output=True, text=True,
                          timeout=timeout)


def summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def rejected(proc, *words):
    """The job ended with exit status 2 and one clean message holding `words`."""
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert text.count("invalid configuration") == 1, text
    assert "Traceback" not in text, text
    for w in words:
        assert w in text, text
    return text


def flip_a_byte(path):
    """Corrupt one byte inside the first contiguous dataset of an HDF5 file."""
    with h5py.File(path, "r") as f:
        found = []
        f.visititems(lambda name, obj: found.append(obj.id.get_offset())
                     if isinstance(obj, h5py.Dataset) and obj.id.get_offset() else None)
    raw = bytearray(path.read_bytes())
    raw[found[0] + 4] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The runs several tests start from, each made once: "base" (`-n 2`, 1500 steps, to
    its final checkpoint) and "resumed" (base resumed to 3000 steps with --resume
    latest).  `made(kind, run_dir)` copies one to `run_dir` as if it had run there (the
    paths summary.json names are rewritten; no other file the runtime reads holds
    one), so each test faults a run of its own."""
    root = tmp_path_factory.mktemp("made")
    base, resumed = root / "base", root / "resumed"
    proc = run(pal_cmd(2, base, "--total-steps", "1500"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shutil.copytree(base, resumed)
    _rewrite_summary(resumed, base)
    proc = run(pal_cmd(2, resumed, "--total-steps", "3000", "--resume", "latest"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary(resumed)["resumed_from"] == summary(base)["checkpoint"].replace(
        str(base), str(resumed))

    def copy(kind, run_dir):
        src = {"base": base, "resumed": resumed}[kind]
        shutil.copytree(src, run_dir)
        _rewrite_summary(run_dir, src)
        return summary(run_dir)
    return copy


def _rewrite_summary(run_dir, src):
    path = run_dir / "summary.json"
    path.write_text(path.read_text().replace(str(src), str(run_dir)))


def test_a_fresh_run_into_a_used_run_dir_is_refused(tmp_path, made):
    """Fault 3: it used to truncate the old log, prune the old run's checkpoints and
    later resume the old run."""
    run_dir = tmp_path / "run"
    made("base", run_dir)
    before = {p.name: p.read_bytes() for p in [run_dir / "metrics.h5",
                                               *ckpt.list_checkpoints(run_dir)]}
    t0 = time.monotonic()
    proc = run(pal_cmd(2, run_dir, "--total-steps", "1500"), timeout=60)
    rejected(proc, f"run_dir: {run_dir} already holds a run", "--resume latest", "--overwrite")
    assert time.monotonic() - t0 < 30
    after = {p.name: p.read_bytes() for p in [run_dir / "metrics.h5",
                                              *ckpt.list_checkpoints(run_dir)]}
    assert after == before                               # nothing touched
    proc = run(pal_cmd(2, run_dir, "--total-steps", "1000", "--overwrite"))
    assert proc.returncode == 0, proc.stderr
    assert summary(run_dir)["resumed_from"] is None
    assert [p.name for p in ckpt.list_checkpoints(run_dir)] == [
        os.path.basename(summary(run_dir)["checkpoint"])]   # the old run's are gone


def test_a_second_job_on_a_run_dir_in_use_is_refused(tmp_path):
    """Fault 4: both jobs ran; B truncated A's open log."""
    run_dir = tmp_path / "run"
    a = subprocess.Popen(pal_cmd(2, run_dir, "--total-steps", "10000000"), cwd=ROOT,
                         env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        for line in a.stdout:                   # A is training
            if "updates" in line:
                break
        b = run(pal_cmd(2, run_dir, "--total-steps", "3000", "--resume", "auto"), timeout=60)
        rejected(b, f"run_dir: {run_dir} is in use by another job (pid ", "--run-dir")
        assert a.poll() is None                 # A goes on
        a.send_signal(STOP_SIGNAL)              # checkpoint, exit 75 (work left)
        out, err = a.communicate(timeout=120)
        assert a.returncode == 75, err
        assert STOP_SIGNAL.name in summary(run_dir)["stop_reason"]
    finally:
        a.kill()
        a.wait()


def test_damaged_checkpoints_are_set_aside_never_kept_over_good_ones(tmp_path, made):
    """Fault 2: pruning by step number deleted the good checkpoints and kept a corrupt
    newest one, or a junk step_999999.h5, and the summary named a deleted file."""
    run_dir = tmp_path / "run"
    resumed = made("resumed", run_dir)               # 1500 steps, resumed to 3000
    good, corrupt = resumed["resumed_from"], resumed["checkpoint"]
    flip_a_byte(ckpt.Path(corrupt))

    proc = run(pal_cmd(2, run_dir, "--total-steps", "4500", "--resume", "latest",
                       "--keep-checkpoints", "1"))
    assert proc.returncode == 0, proc.stderr
    s = summary(run_dir)
    assert s["resumed_from"] == good
    assert os.path.exists(s["checkpoint"])
    assert [str(p) for p in ckpt.list_checkpoints(run_dir)] == [s["checkpoint"]]
    assert "set aside damaged checkpoint" in proc.stdout
    damaged = ckpt.checkpoint_dir(run_dir) / ckpt.DAMAGED
    assert "checksum mismatch" in (damaged / "REASONS.txt").read_text()

    junk = ckpt.checkpoint_dir(run_dir) / "step_999999.h5"
    junk.write_bytes(os.urandom(5000))
    newest = s["checkpoint"]
    proc = run(pal_cmd(2, run_dir, "--total-steps", "6000", "--resume", "latest",
                       "--keep-checkpoints", "1"))
    assert proc.returncode == 0, proc.stderr
    s = summary(run_dir)
    assert s["resumed_from"] == newest and os.path.exists(s["checkpoint"])
    assert not junk.exists()
    for p in ckpt.list_checkpoints(run_dir):
        ckpt.verify_all(p)
    proc = run(pal_cmd(2, run_dir, "--total-steps", "7000", "--resume", "latest"))
    assert proc.returncode == 0, proc.stderr


def test_resume_from_an_older_checkpoint_sets_the_newer_ones_aside(tmp_path, made):
    run_dir = tmp_path / "run"
    resumed = made("resumed", run_dir)               # 1500 steps, resumed to 3000
    old, abandoned = resumed["resumed_from"], resumed["checkpoint"]
    assert os.path.exists(old) and os.path.exists(abandoned)
    proc = run(pal_cmd(2, run_dir, "--total-steps", "2000", "--resume", old))
    assert proc.returncode == 0, proc.stderr
    assert not os.path.exists(abandoned)
    assert list((ckpt.checkpoint_dir(run_dir) / ckpt.SUPERSEDED).glob("step_*.h5"))
    assert ckpt.latest_valid(run_dir) == ckpt.Path(summary(run_dir)["checkpoint"])


def test_resume_after_the_metrics_log_was_truncated(tmp_path, made):
    """Fault 1: a damaged metrics.h5 blocked every resume ("file is already open for
    write"); now the log goes on in a new segment and the old one stays as it was."""
    run_dir = tmp_path / "run"
    made("base", run_dir)
    log = run_dir / "metrics.h5"
    with open(log, "r+b") as fh:
        fh.truncate(50_000)
    damaged = log.read_bytes()
    proc = run(pal_cmd(2, run_dir, "--total-steps", "3000", "--resume", "latest"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "metrics.1.h5" in proc.stdout and "cannot be appended to" in proc.stdout
    assert log.read_bytes() == damaged
    assert (run_dir / "metrics.1.h5").exists()
    assert summary(run_dir)["env_steps"] >= 3000


def test_resume_pointed_at_a_replay_file_says_which_file_to_pass(tmp_path, made):
    """Fault 12: four KeyError: 'config' tracebacks."""
    run_dir = tmp_path / "run"
    main = ckpt.Path(made("base", run_dir)["checkpoint"])
    replay = next(main.parent.glob(main.stem + "_replay0*.h5"))
    proc = run(pal_cmd(2, run_dir, "--resume", str(replay)), timeout=60)
    rejected(proc, "replay buffer, not a checkpoint", f"pass {main}")


@pytest.mark.parametrize("case", ["file", "checkpoints_file"])
def test_an_unusable_run_dir_is_refused_at_start_up(tmp_path, case):
    """Fault 11: found only when the final checkpoint was written, after all training."""
    if case == "file":
        run_dir = tmp_path / "run"
        run_dir.write_text("x")
    else:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "checkpoints").write_text("x")
    t0 = time.monotonic()
    proc = run(pal_cmd(2, run_dir, "--total-steps", "1000000"), timeout=60)
    rejected(proc, f"run_dir: {run_dir}")
    assert time.monotonic() - t0 < 30


def test_a_replay_larger_than_memory_is_refused_before_allocating(tmp_path):
    """Fault 5: ALE/Pong-v5 at the default capacity asked for ~20 GB on a 23 GB machine.
    Twice what fits, sized as the run lays it out: each frame stored once (DQN's Atari
    defaults, n-step 3), so a size computed for whole transitions would now fit."""
    env = make_env("ALE/Pong-v5", 0)            # the preprocessed frames the replay stores
    spec = transition_spec(*obs_info(env), frame_stack=True)
    env.close()
    per = FrameStackReplay.window_nbytes(spec, 1000, n_step=3) / 1000
    capacity = int(2 * available_memory()[0] / per)
    t0 = time.monotonic()
    proc = run(pal_cmd(2, tmp_path / "run", "--env", "ALE/Pong-v5", "--replay-capacity",
                       str(capacity)), timeout=90)
    rejected(proc, "replay_capacity:", "GiB of shared memory", "lower --replay-capacity")
    assert time.monotonic() - t0 < 60
    proc = run(pal_cmd(2, tmp_path / "run2", "--replay-capacity", "99999999999999999"),
               timeout=90)
    rejected(proc, "replay_capacity:")


def test_a_checkpoint_holds_only_the_written_part_of_the_replay(tmp_path):
    """Fault 5: a 20 GB checkpoint for 56 transitions."""
    run_dir = tmp_path / "run"
    capacity = 1_000_000
    proc = run(pal_cmd(2, run_dir, "--total-steps", "1500", "--replay-capacity",
                       str(capacity)))
    assert proc.returncode == 0, proc.stderr
    main = ckpt.Path(summary(run_dir)["checkpoint"])
    replay = next(main.parent.glob(main.stem + "_replay0*.h5"))
    window = SharedReplay.window_nbytes(transition_spec((4,), "float32"), capacity)
    assert replay.stat().st_size < 0.25 * window, (replay.stat().st_size, window)
    proc = run(pal_cmd(2, run_dir, "--total-steps", "3000", "--replay-capacity",
                       str(capacity), "--resume", "latest"))
    assert proc.returncode == 0, proc.stderr
    assert summary(run_dir)["replay_size_at_start"] >= 1400


def test_resume_restores_the_evaluation_schedule(tmp_path):
    """Fault 17: next_eval was not restored, so a resumed run evaluated at once.  The
    checkpoint carries the evaluator's next evaluation step and the resumed run
    evaluates no earlier.  Which evaluations a short run gets done is timing: one is
    made at the first counter round past its step (here ~1,000 steps later), and a run
    may end first (at 3,000 steps the first run had none in 3 of 4 tries, its next step
    stayed 2,000 and the resumed run rightly evaluated at once: the old check, "none
    before 4,000", failed then).  So the check is against the step the checkpoint
    holds; at 3,600 steps that is 4,000 whenever the evaluation at 2,000 was done, and
    a resume that ignored it would evaluate at once, before it."""
    run_dir = tmp_path / "run"
    flags = ["--eval-every", "2000"]
    assert run(pal_cmd(2, run_dir, "--total-steps", "3600", *flags)).returncode == 0
    first = summary(run_dir)
    with h5py.File(first["checkpoint"], "r") as f:     # the evaluator's is the latest
        saved = max(float(g.attrs["next_eval"]) for g in f["ranks"].values())
    assert saved >= 2000 and saved % 2000 == 0, saved
    assert all(e["env_steps"] < saved for e in first["evaluations"]), (saved, first)
    proc = run(pal_cmd(2, run_dir, "--total-steps", "6000", "--resume", "latest", *flags))
    assert proc.returncode == 0, proc.stderr
    new = summary(run_dir)["evaluations"][len(first["evaluations"]):]
    assert new and all(e["env_steps"] >= saved for e in new), (saved, new)


def _unshare() -> list[str]:
    """A private mount namespace (as root; else a user namespace that maps us to root)."""
    if not shutil.which("unshare"):
        raise RuntimeError("unshare (util-linux) is needed for the disk-full test")
    return ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]


@pytest.mark.parametrize("mode", ["recover", "stay"])
def test_a_full_disk_costs_a_checkpoint_not_the_run(tmp_path, mode):
    """Fault 6: the first failed checkpoint aborted the job with three tracebacks and
    left a *.h5.tmp behind forever."""
    run_dir = tmp_path / "run"
    cmd = [*_unshare(), sys.executable, str(ROOT / "tests/mpi/disk_full.py"), str(run_dir),
           mode, *pal_cmd(2, run_dir, "--total-steps", "12000", "--checkpoint-every", "0.3")]
    proc = run(cmd, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    text = res["stdout"] + res["stderr"]
    assert res["first_checkpoint"] and res["failure_reported"], text
    assert "Traceback" not in text, text
    assert res["tmp_files"] == [], text
    assert "not written" in res["stderr"] and "the newest checkpoint is still" in res["stderr"]
    if mode == "recover":
        assert res["rc"] == 0, text
        assert res["summary"]["env_steps"] >= 12000
        assert os.path.basename(res["summary"]["checkpoint"]) in res["checkpoints"]
    else:
        assert res["rc"] == 1, text
        assert "the final checkpoint could not be written" in res["stderr"], text
        assert res["checkpoints"], text                 # the earlier ones are kept
