"""A run directory: checked before any work starts, and owned by one job at a time.

`claim_run_dir` is what rank 0 of a job calls first: it checks that the directory can
be written (not a file, not under a file, not read-only, `checkpoints` not a file),
refuses a fresh start into a directory that holds an earlier run unless asked to
overwrite it, and takes an exclusive `flock` on `<run dir>/.lock` for the job's life.
The kernel drops an flock when its holder dies in any way (kill -9, OOM, node loss),
so a stale lock never blocks a requeued job the way a marker file would.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path

from pal_hpc.config import ConfigError

LOCK_NAME = ".lock"
# What an earlier run leaves behind (metrics log segments, the summary, checkpoints).
RUN_FILES = ("metrics*.h5", "summary.json", "config.json")


# Space left free on a file system after a checkpoint or log write: HDF5 metadata and
# other writers need some slack.
DISK_MARGIN = 8 << 20


def free_bytes(path) -> int:
    """Bytes an unprivileged writer may still use on the file system holding `path`."""
    st = os.statvfs(Path(path) if Path(path).is_dir() else Path(path).parent)
    return st.f_bavail * st.f_frsize


def check_space(path, nbytes: int) -> None:
    """Raise OSError(ENOSPC) naming `path` unless `nbytes` (plus a margin) fit beside it."""
    free = free_bytes(path)
    if nbytes + DISK_MARGIN > free:
        raise OSError(errno.ENOSPC, f"{Path(path).name}: needs {nbytes / 2**20:,.1f} MiB "
                                    f"(+{DISK_MARGIN >> 20} MiB margin), "
                                    f"{free / 2**20:,.1f} MiB free")


class RunDirLock:
    """An exclusive flock on `<run dir>/.lock`, held until `release()` or process exit."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ConfigError naming the directory and the holder."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise ConfigError(
                f"run_dir: {self.path.parent} is in use by another job ({holder}); wait for "
                f"it to end, or give this job its own --run-dir") from None
        except BaseException:
            os.close(fd)
            raise
        # Who holds it, for the message another job gets (the lock is the flock itself).
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (also done by the kernel when the process ends)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return f"pid {info['pid']} on {info['host']} since {info['since']}"
    except (OSError, ValueError, KeyError):
        return "holder unknown"


def probe_write(directory: Path) -> None:
    """Create and remove a file in `directory`; OSError if it cannot be written."""
    probe = directory / f".write-test-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()


def check_writable(run_dir: str | Path) -> Path:
    """Create `run_dir` (and `checkpoints/`) if needed and prove it can be written.

    Raises ConfigError naming the path at start-up, instead of at the first checkpoint
    after all the training."""
    run_dir = Path(run_dir)
    for parent in [run_dir, *run_dir.parents]:
        if parent.exists() and not parent.is_dir():
            what = "is a file" if parent == run_dir else f"is under {parent}, which is a file"
            raise ConfigError(f"run_dir: {run_dir} {what}; give a directory")
    ckpts = run_dir / "checkpoints"
    if ckpts.exists() and not ckpts.is_dir():
        raise ConfigError(f"run_dir: {ckpts} is a file, but checkpoints go into a directory "
                          f"of that name; move it away or give another --run-dir")
    try:
        ckpts.mkdir(parents=True, exist_ok=True)
        for d in (run_dir, ckpts):
            probe_write(d)
    except OSError as exc:
        raise ConfigError(f"run_dir: {run_dir} cannot be written ({exc.strerror or exc}); "
                          f"give a writable --run-dir") from None
    return run_dir


def earlier_run(run_dir: str | Path) -> list[str]:
    """Names of what an earlier run left in `run_dir` (empty: the directory is unused)."""
    run_dir = Path(run_dir)
    found = sorted(p.name for pattern in RUN_FILES for p in run_dir.glob(pattern))
    ckpts = run_dir / "checkpoints"
    if ckpts.is_dir():
        n = sum(1 for p in ckpts.glob("step_*.h5") if "_replay" not in p.name)
        if n:
            found.append(f"{n} checkpoint(s)")
    return found


def delete_earlier_run(run_dir: str | Path) -> None:
    """What `--overwrite` does: remove the logs, summary and checkpoints of an earlier run
    (set-aside checkpoints and abandoned logs included)."""
    run_dir = Path(run_dir)
    for pattern in RUN_FILES:
        for p in run_dir.glob(pattern):
            p.unlink()
    for d in [run_dir / "checkpoints", *run_dir.glob("abandoned-*")]:
        shutil.rmtree(d, ignore_errors=True)
    (run_dir / "checkpoints").mkdir()


def claim_run_dir(run_dir: str | Path, resume: str, overwrite: bool,
                  check: Callable[[Path], object] | None = None) -> RunDirLock:
    """Check, lock and (with `overwrite`) clear `run_dir` for a job; returns the held lock.

    A fresh start (no `resume`) into a directory holding an earlier run is refused: it
    would truncate that run's log, prune its checkpoints and mix the two runs.  `check`
    (run_dir), if given, is what else the run needs there (--tensorboard's directory:
    pal_hpc.io.tensorboard.check_tensorboard_dir); it raises ConfigError to refuse."""
    run_dir = check_writable(run_dir)
    lock = RunDirLock(run_dir)
    lock.acquire()
    try:
        if check is not None:
            check(run_dir)
        left = earlier_run(run_dir)
        if left and not resume:
            if not overwrite:
                raise ConfigError(
                    f"run_dir: {run_dir} already holds a run ({', '.join(left)}); pass "
                    f"--resume latest to continue it, a new --run-dir to start another, or "
                    f"--overwrite to delete it and start again")
            delete_earlier_run(run_dir)
    except BaseException:
        lock.release()
        raise
    return lock
