"""How a rank ends once `pal_hpc.main.main` has returned (`pal_hpc.main.finish`): quickly,
without the interpreter's teardown, unless something still needs the exit handlers; the
status and the output arrive either way, and a file left open is written in full."""

from __future__ import annotations

import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import ROOT, mpi_env, pal_cmd


def python(code: str) -> subprocess.CompletedProcess:
    """Run `code` with block-buffered output (as a rank's, into a pipe or a file)."""
    env = mpi_env()
    env.pop("PYTHONUNBUFFERED", None)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("setup, reason", [
    ("", ""),
    ("import h5py; f = h5py.File(sys.argv[0] + '.h5', 'w')", "an HDF5 file is open"),
    ("import threading, time; threading.Thread(target=time.sleep, args=(0.5,)).start()",
     "a thread is running"),
    ("import threading, time\n"
     "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()", ""),
    ("import multiprocessing as mp, time; p = mp.Process(target=time.sleep, args=(0.5,));"
     " p.start()", "a child process is alive"),
])
def test_what_keeps_the_exit_handlers(tmp_path, setup, reason):
    code = (f"import sys; sys.argv = [{str(tmp_path / 'f')!r}]\n{setup}\n"
            "import pal_hpc.main as m; print(repr(m._needs_exit_handlers()))")
    proc = python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == repr(reason)


def test_the_quick_exit_keeps_the_status_and_the_output():
    proc = python("import sys, torch; from pal_hpc.main import finish\n"
                  "sys.stdout.write('out, no newline'); sys.stderr.write('err')\n"
                  "finish(75)")
    assert proc.returncode == 75
    assert proc.stdout == "out, no newline" and proc.stderr == "err"


def test_a_file_left_open_is_written_in_full(tmp_path):
    path = tmp_path / "open.h5"
    proc = python(f"import h5py, numpy as np; from pal_hpc.main import finish\n"
                  f"f = h5py.File({str(path)!r}, 'w'); f['x'] = np.arange(1000)\n"
                  f"finish(0)")
    assert proc.returncode == 0, proc.stderr
    with h5py.File(path, "r") as f:
        assert np.array_equal(f["x"][:], np.arange(1000))


def test_a_job_ends_through_it_with_mpi_finalized(tmp_path):
    """Under mpiexec, two ranks: the quick exit finalizes MPI first, so the launcher
    sees a clean end (status 0, no abort lines) and rank 0's summary is complete."""
    proc = subprocess.run(pal_cmd(2, tmp_path / "run", "--total-steps", "600"), cwd=ROOT,
                          env=mpi_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("summary: ") == 1 and proc.stdout.rstrip().endswith("}")
    assert "Abort" not in proc.stdout + proc.stderr
    assert (tmp_path / "run" / "summary.json").exists()
