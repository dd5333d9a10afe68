"""The run directory: checked at start-up, refused when it holds an earlier run, and
locked by one job at a time (an flock, released however its holder dies)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from pal_hpc.config import ConfigError
from pal_hpc.io.rundir import claim_run_dir, earlier_run

HOLD = """
import sys, time
from pal_hpc.io.rundir import claim_run_dir
claim_run_dir(sys.argv[1], "", False)
print("locked", flush=True)
time.sleep(600)
"""


def test_a_fresh_directory_is_created_and_locked(tmp_path):
    run_dir = tmp_path / "a" / "b"
    lock = claim_run_dir(run_dir, "", False)
    assert (run_dir / "checkpoints").is_dir()
    with pytest.raises(ConfigError, match=rf"^run_dir: {run_dir} is in use by another job "
                                          rf"\(pid {os.getpid()} on "):
        claim_run_dir(run_dir, "latest", False)       # flocks exclude per open file
    lock.release()
    claim_run_dir(run_dir, "latest", False).release()


@pytest.mark.parametrize("case", ["file", "under_file", "checkpoints_file"])
def test_unusable_directories_are_refused_naming_the_path(tmp_path, case):
    if case == "file":
        run_dir = tmp_path / "f"
        run_dir.write_text("x")
        match = "is a file"
    elif case == "under_file":
        (tmp_path / "f").write_text("x")
        run_dir = tmp_path / "f" / "run"
        match = f"is under {tmp_path / 'f'}, which is a file"
    else:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "checkpoints").write_text("x")
        match = "checkpoints is a file"
    with pytest.raises(ConfigError, match=f"^run_dir: .*{match}"):
        claim_run_dir(run_dir, "", False)


def test_a_read_only_directory_is_refused(tmp_path):
    run_dir = tmp_path / "ro"
    run_dir.mkdir()
    if os.geteuid() == 0:
        # Permission bits do not stop root: a read-only mount does.
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(run_dir)],
                       check=True)
    else:
        run_dir.chmod(0o500)
    try:
        with pytest.raises(ConfigError, match=rf"^run_dir: {run_dir}.* cannot be written"):
            claim_run_dir(run_dir / "run", "", False)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(run_dir)], check=True)
        else:
            run_dir.chmod(0o700)


def test_an_earlier_run_is_refused_unless_resumed_or_overwritten(tmp_path):
    run_dir = tmp_path / "run"
    claim_run_dir(run_dir, "", False).release()
    (run_dir / "metrics.h5").write_bytes(b"old log")
    (run_dir / "checkpoints" / "step_0000000010.h5").write_bytes(b"old checkpoint")
    assert earlier_run(run_dir) == ["metrics.h5", "1 checkpoint(s)"]
    with pytest.raises(ConfigError) as err:
        claim_run_dir(run_dir, "", False)
    msg = str(err.value)
    assert msg.startswith(f"run_dir: {run_dir} already holds a run")
    assert "--resume latest" in msg and "--run-dir" in msg and "--overwrite" in msg
    assert (run_dir / "metrics.h5").read_bytes() == b"old log"     # nothing touched
    claim_run_dir(run_dir, "auto", False).release()                 # resuming is fine
    claim_run_dir(run_dir, "", True).release()                      # overwrite clears it
    assert earlier_run(run_dir) == []


def test_the_lock_is_released_when_its_holder_is_killed(tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ConfigError, match=rf"in use by another job \(pid {holder.pid} "):
            claim_run_dir(run_dir, "auto", False)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        deadline = time.monotonic() + 10
        while True:                 # the kernel drops the flock with the process
            try:
                claim_run_dir(run_dir, "auto", False).release()
                break
            except ConfigError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        holder.kill()
        holder.wait()
