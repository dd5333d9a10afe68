"""Run a real training job whose run directory is a small tmpfs that fills up.

Launched by tests/test_faults_runs.py inside a private mount namespace
(`unshare -m`), so the tmpfs disappears with this process.  Usage:

    disk_full.py RUN_DIR MODE [mpiexec args ...]

MODE "recover": fill the disk after the first checkpoint, wait for a checkpoint to fail,
free the disk, and let the job finish.  MODE "stay": fill it and leave it full, so the
final checkpoint fails too.  Prints one JSON line with what happened.
"""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from pal_hpc.io.checkpoint import list_checkpoints

run_dir, mode, cmd = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
run_dir.mkdir(parents=True, exist_ok=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(run_dir)], check=True)

proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
out: list[str] = []
err: list[str] = []
threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True).start()
threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()


def wait_for(pred, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline or proc.poll() is not None:
            return False
        time.sleep(0.1)
    return True


# A checkpoint is whole once its main file `step_<N>.h5` is there: the node's replay
# part `step_<N>_replay<k>_<tag>.h5` is renamed into place first, so waiting on any
# `step_*.h5` could fill the disk between the two and leave no checkpoint at all.
def main_checkpoints() -> list[str]:
    return [p.name for p in list_checkpoints(run_dir)]


first_ok = wait_for(lambda: bool(main_checkpoints()))
filler = run_dir / "filler"
fd = os.open(filler, os.O_WRONLY | os.O_CREAT)     # take every free byte
try:
    while True:
        os.write(fd, b"\1" * (1 << 16))
except OSError:
    pass
os.close(fd)
failed = wait_for(lambda: any("not written" in line for line in err))
if mode == "recover":
    filler.unlink()
try:
    rc = proc.wait(timeout=180)
except subprocess.TimeoutExpired:
    proc.kill()
    rc = "timeout"
time.sleep(0.2)                                # let the reader threads drain
print(json.dumps({
    "rc": rc, "first_checkpoint": first_ok, "failure_reported": failed,
    "stdout": "".join(out), "stderr": "".join(err),
    "checkpoints": main_checkpoints(),
    "tmp_files": sorted(str(p) for p in run_dir.rglob("*.tmp")),
    "summary": json.loads((run_dir / "summary.json").read_text())
    if (run_dir / "summary.json").exists() else None,
}))
