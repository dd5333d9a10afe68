"""The HDF5 metrics log: written by MetricsLog, read back by h5py, read_metrics, h5dump,
by a second process while the writer is open, and after the writer was killed; a run's
log in segments (resume after a killed writer or a damaged file); truncated files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import h5py
import numpy as np
import pytest

from pal_hpc.io.metrics import (MetricsLog, MetricsReadError, log_segments, open_run_log,
                                read_metrics, read_run_metrics)
from pal_hpc.io.provenance import run_attributes
from pal_hpc.io.schema import STREAMS

from conftest import ROOT

ATTRS = {"config": {"algo": "dqn", "lr": 1e-3, "hidden": [64, 64], "target_return": None},
         "layout": {"ranks": 4, "actors": 3, "learners": 1}, "hosts": ["node1", "node2"],
         "mpi_library": "MPICH Version: 5.0", "seed": 7, "lr": 0.5, "note": None}


def records(stream: str, n: int, start: int = 0) -> np.ndarray:
    """n distinct rows of that stream: field k of row i holds (start + i) * 10 + k."""
    arr = np.zeros(n, dtype=STREAMS[stream])
    for k, name in enumerate(arr.dtype.names):
        arr[name] = (np.arange(start, start + n) * 10 + k).astype(arr.dtype[name])
    return arr


def read_in_subprocess(path) -> dict:
    """Row counts and attrs as another process sees them, via read_metrics."""
    code = textwrap.dedent(f"""
        import json
        from pal_hpc.io.metrics import read_metrics
        m = read_metrics({str(path)!r})
        print(json.dumps({{"rows": {{k: len(v) for k, v in m.items() if k != "attrs"}},
                          "eval_steps": m["evaluation"]["env_step"].tolist(),
                          "layout": m["attrs"]["layout"]}}))
    """)
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def write_all(path, n: int = 5) -> None:
    with MetricsLog(path, ATTRS) as log:
        for stream in STREAMS:
            log.append(stream, records(stream, n))


def test_every_stream_round_trips_through_h5py_and_read_metrics(tmp_path):
    path = tmp_path / "metrics.h5"
    write_all(path)
    with h5py.File(path, "r") as f:
        assert set(f) == set(STREAMS)
        for stream, dtype in STREAMS.items():
            ds = f[stream]
            assert ds.dtype == dtype and ds.maxshape == (None,) and ds.chunks == (1024,)
            np.testing.assert_array_equal(ds[()], records(stream, 5))
        assert json.loads(f.attrs["config"]) == ATTRS["config"]
        assert f.attrs["note"] == ""
    m = read_metrics(path)
    for stream in STREAMS:
        assert m[stream].dtype == STREAMS[stream]
        np.testing.assert_array_equal(m[stream], records(stream, 5))


def test_attrs_round_trip_json_decoded(tmp_path):
    path = tmp_path / "metrics.h5"
    attrs = {**ATTRS, **run_attributes(ATTRS["config"], ATTRS["layout"], ATTRS["hosts"],
                                       ATTRS["mpi_library"], cpus={"n1": "CPU\x00 A, 2 CPUs"})}
    MetricsLog(path, attrs).close()
    got = read_metrics(path)["attrs"]
    assert got == {**attrs, "note": ""}
    assert isinstance(got["seed"], int) and isinstance(got["lr"], float)
    assert set(got["versions"]) >= {"python", "numpy", "torch", "gymnasium", "h5py",
                                    "mpi4py", "pal_hpc"}
    assert got["versions"]["h5py"] == h5py.__version__
    assert got["start_time"][:2] == "20" and "T" in got["start_time"]
    assert isinstance(got["git_commit"], str)
    assert got["cpus"] == {"n1": "CPU A, 2 CPUs"}           # cleaned to what HDF5 stores
    with pytest.raises(TypeError, match="'bad'"):
        MetricsLog(tmp_path / "other.h5", {"bad": object()})


def test_many_batches_and_list_of_tuples(tmp_path):
    path = tmp_path / "metrics.h5"
    with MetricsLog(path, {}, flush_every=0.0) as log:
        for b in range(300):                     # crosses several 1024-row chunks
            log.append("system", records("system", 7, start=7 * b))
        log.append("evaluation", [(100, 1.5, 9.0, 0.5, 10), (200, 3.0, 20.0, 1.0, 10)])
        log.append("evaluation", records("evaluation", 0))
        assert log.rows("system") == 2100 and log.rows("evaluation") == 2
    m = read_metrics(path)
    np.testing.assert_array_equal(m["system"], records("system", 2100))
    assert m["evaluation"]["env_step"].tolist() == [100, 200]
    assert m["evaluation"]["mean_return"].tolist() == [9.0, 20.0]


def test_wrong_dtype_and_unknown_stream_are_rejected(tmp_path):
    with MetricsLog(tmp_path / "metrics.h5", {}) as log:
        with pytest.raises(ValueError, match="'evaluations'"):
            log.append("evaluations", records("evaluation", 1))
        with pytest.raises(ValueError, match="'learner'.*dtype"):
            log.append("learner", records("evaluation", 1))
        with pytest.raises(ValueError, match="'episodes'"):
            log.append("episodes", [(1, 2.0)])       # too few fields
        assert log.rows("learner") == 0
    assert all(len(read_metrics(tmp_path / "metrics.h5")[s]) == 0 for s in STREAMS)


def test_zero_rows_file_reads_as_empty_arrays(tmp_path):
    path = tmp_path / "metrics.h5"
    MetricsLog(path, {"layout": {"ranks": 1}}).close()
    m = read_metrics(path)
    assert m["attrs"] == {"layout": {"ranks": 1}}
    for stream, dtype in STREAMS.items():
        assert m[stream].shape == (0,) and m[stream].dtype == dtype


def test_second_process_reads_while_writer_is_open(tmp_path):
    path = tmp_path / "metrics.h5"
    with MetricsLog(path, ATTRS, flush_every=3600) as log:
        seen = read_in_subprocess(path)
        assert seen["rows"] == {s: 0 for s in STREAMS} and seen["layout"] == ATTRS["layout"]
        log.append("evaluation", records("evaluation", 3))
        log.append("system", records("system", 2000))
        log.flush()
        seen = read_in_subprocess(path)
        assert seen["rows"]["evaluation"] == 3 and seen["rows"]["system"] == 2000
        assert seen["eval_steps"] == [0, 10, 20]
        log.append("evaluation", records("evaluation", 2, start=3))
        log.flush()
        assert read_in_subprocess(path)["eval_steps"] == [0, 10, 20, 30, 40]


POLLER = """
import os, sys
from pal_hpc.io.metrics import read_metrics
folder, count = sys.argv[1], int(sys.argv[2])
read, errors = set(), []
print("ready", flush=True)
while len(read) < count:
    for name in sorted(os.listdir(folder)):
        if name.endswith(".h5") and name not in read:   # read at once when it appears
            read.add(name)
            try:
                read_metrics(os.path.join(folder, name))
            except Exception as exc:
                errors.append(repr(exc))
print(len(read), errors)
"""


def test_a_new_log_appears_whole_or_not_at_all(tmp_path):
    """A new log is made under a hidden name and renamed into place once its streams
    exist: another process reading each log the moment its name appears never finds a
    half-made file (a run's log read as the run starts: the reader saw 48 bytes before).
    A log whose attributes HDF5 refuses leaves no file behind."""
    logs = tmp_path / "logs"
    logs.mkdir()
    count = 40
    poller = subprocess.Popen([sys.executable, "-c", POLLER, str(logs), str(count)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert poller.stdout.readline() == "ready\n"
        for i in range(count):
            with MetricsLog(logs / f"run{i}.h5", ATTRS) as log:
                log.append("evaluation", records("evaluation", 2))
        out, err = poller.communicate(timeout=120)
    finally:
        poller.kill()
    assert poller.returncode == 0, err
    assert out.strip() == f"{count} []", out
    assert sorted(os.listdir(logs)) == sorted(f"run{i}.h5" for i in range(count))
    with pytest.raises(ValueError, match="'bad'"):
        MetricsLog(tmp_path / "bad.h5", {"bad": 2 ** 70})        # HDF5 cannot store it
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".bad", "bad"))]


WRITER = """
import os, sys, time
sys.path.insert(0, {tests!r})
from test_metrics_log import records
from pal_hpc.io.metrics import MetricsLog
log = MetricsLog({path!r}, {{"layout": {{"ranks": 2}}}}, flush_every=3600)
log.append("evaluation", records("evaluation", 40))
log.append("system", records("system", 1500))
log.flush()
log.append("evaluation", records("evaluation", 5, start=40))   # never flushed
print("flushed", flush=True)
time.sleep(60)
"""


def test_killed_writer_leaves_flushed_rows_readable(tmp_path):
    path = tmp_path / "metrics.h5"
    code = WRITER.format(tests=str(ROOT / "tests"), path=str(path))
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "flushed", proc.stderr.read()
    finally:
        proc.kill()                               # SIGKILL: no close, no flush
        proc.wait(timeout=30)
    m = read_metrics(path)
    assert m["attrs"]["layout"] == {"ranks": 2}
    assert 40 <= len(m["evaluation"]) <= 45
    np.testing.assert_array_equal(m["evaluation"][:40], records("evaluation", 40))
    np.testing.assert_array_equal(m["system"], records("system", 1500))


def test_h5dump_reads_the_log(tmp_path):
    h5dump = shutil.which("h5dump")
    if h5dump is None:
        pytest.skip("h5dump not on PATH (Debian/Ubuntu: apt-get install hdf5-tools)")
    path = tmp_path / "metrics.h5"
    with MetricsLog(path, ATTRS) as log:
        log.append("evaluation", [(5000, 12.5, 123.25, 4.5, 10), (10000, 25.0, 475.5, 1.0, 10)])
    header = subprocess.run([h5dump, "-H", str(path)], capture_output=True, text=True,
                            timeout=30)
    assert header.returncode == 0, header.stderr
    for stream in STREAMS:
        assert f'DATASET "{stream}"' in header.stdout
    assert '"mean_return"' in header.stdout and 'ATTRIBUTE "layout"' in header.stdout
    data = subprocess.run([h5dump, "-d", "/evaluation", str(path)], capture_output=True,
                          text=True, timeout=30)
    assert data.returncode == 0, data.stderr
    values = data.stdout.split("DATA {", 1)[1]
    for value in ("5000", "10000", "12.5", "123.25", "4.5", "475.5"):
        assert value in values


# -- segments: resuming a killed or damaged log ----------------------------------------

SEGMENT_WRITER = """
import sys, time
sys.path.insert(0, {tests!r})
from test_metrics_log import ATTRS, records
from pal_hpc.io.metrics import open_run_log
log = open_run_log({run_dir!r}, ATTRS, resume=False, flush_every=3600)
for b in range({batches}):
    log.append("evaluation", records("evaluation", 10, start=10 * b))
    log.append("system", records("system", 100, start=100 * b))
    log.flush()
print("flushed", flush=True)
time.sleep(60)
"""


def killed_run(run_dir, batches: int = 4):
    """A run dir whose metrics.h5 writer (a real child process) was SIGKILLed after
    flushing `batches` batches of 10 evaluation and 100 system rows."""
    code = SEGMENT_WRITER.format(tests=str(ROOT / "tests"), run_dir=str(run_dir),
                                 batches=batches)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "flushed", proc.stderr.read()
    finally:
        proc.kill()
        proc.wait(timeout=30)
    return run_dir / "metrics.h5"


def test_fresh_then_clean_resume_appends_to_the_same_file(tmp_path):
    run = tmp_path / "run"
    (run).mkdir()
    (run / "metrics.3.h5").write_bytes(b"left over from an overwritten run")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with open_run_log(run, {**ATTRS, "start_time": "t0"}, resume=False) as log:
            log.append("evaluation", records("evaluation", 3))
        assert log_segments(run) == [run / "metrics.h5"]
        with open_run_log(run, {**ATTRS, "start_time": "t1"}, resume=True) as log:
            assert log.path == run / "metrics.h5" and log.rows("evaluation") == 3
            log.append("evaluation", records("evaluation", 2, start=3))
        m = read_run_metrics(run)
    assert log_segments(run) == [run / "metrics.h5"]
    np.testing.assert_array_equal(m["evaluation"], records("evaluation", 5))
    assert m["attrs"]["resumes"] == ["t1"] and m["attrs"]["start_time"] == "t0"
    assert m["segments"] == [run / "metrics.h5"] and m["unreadable"] == {}


def test_resume_after_killed_writer_continues_in_a_new_segment(tmp_path):
    run = tmp_path / "run"
    first = killed_run(run)
    before = first.read_bytes()
    with pytest.raises(OSError, match="already open for write"):
        h5py.File(first, "a")                     # what blocked the resume before
    with pytest.warns(UserWarning, match=r"metrics\.h5 cannot be appended to \(still marked "
                      r"open for writing.*continues in metrics\.1\.h5") as caught:
        log = open_run_log(run, {**ATTRS, "start_time": "t1"}, resume=True)
    assert len(caught) == 1
    with log:
        assert log.path == run / "metrics.1.h5" and log.rows("evaluation") == 0
        log.append("evaluation", records("evaluation", 5, start=40))
    assert first.read_bytes() == before           # the killed segment is left alone
    assert log_segments(run) == [first, run / "metrics.1.h5"]
    second = read_metrics(run / "metrics.1.h5")["attrs"]
    assert second["config"] == ATTRS["config"] and second["layout"] == ATTRS["layout"]
    assert second["continues"] == "metrics.h5"
    assert "marked open for writing" in second["continues_because"]
    # A clean resume from there appends to metrics.1.h5.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with open_run_log(run, ATTRS, resume=True) as log:
            assert log.path == run / "metrics.1.h5"
            log.append("evaluation", records("evaluation", 5, start=45))
        m = read_run_metrics(run)
    np.testing.assert_array_equal(m["evaluation"], records("evaluation", 50))
    np.testing.assert_array_equal(m["system"], records("system", 400))
    assert m["attrs"]["layout"] == ATTRS["layout"] and "continues" not in m["attrs"]
    assert m["segments"] == [first, run / "metrics.1.h5"] and m["unreadable"] == {}


def foreign_hdf5(path):
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(3)


@pytest.mark.parametrize("damage, reason", [
    ("truncate", "truncated: 50,000 bytes"),
    ("random", "not an HDF5 file"),
    ("empty", "not an HDF5 file"),
    ("foreign", "not a metrics log"),
])
def test_resume_over_damaged_log_starts_a_segment_and_reads_around_it(tmp_path, damage,
                                                                      reason):
    run = tmp_path / "run"
    first = killed_run(run, batches=20)
    if damage == "truncate":
        assert first.stat().st_size > 50_000
        os.truncate(first, 50_000)
    elif damage == "random":
        first.write_bytes(np.random.default_rng(0).bytes(20_000))
    elif damage == "empty":
        first.write_bytes(b"")
    else:
        first.unlink()
        foreign_hdf5(first)
    before = first.read_bytes()
    with pytest.warns(UserWarning, match=f"{first}.*{reason}") as caught:
        with open_run_log(run, ATTRS, resume=True) as log:
            log.append("evaluation", records("evaluation", 4))
    assert len(caught) == 1 and first.read_bytes() == before
    assert log_segments(run) == [first, run / "metrics.1.h5"]
    with pytest.raises(MetricsReadError, match=f"^{first}: .*{reason}"):
        read_metrics(first)
    with pytest.warns(UserWarning, match=f"segment {first} skipped: .*{reason}"):
        m = read_run_metrics(run)
    np.testing.assert_array_equal(m["evaluation"], records("evaluation", 4))
    assert m["attrs"]["continues"] == "metrics.h5" and reason in m["attrs"]["continues_because"]
    assert list(m["unreadable"]) == [first] and reason in m["unreadable"][first]
    # A damaged newest segment again: metrics.2.h5 follows metrics.1.h5.
    (run / "metrics.1.h5").write_bytes(b"\0" * 100)
    with pytest.warns(UserWarning, match=r"metrics\.1\.h5 .*metrics\.2\.h5"):
        open_run_log(run, ATTRS, resume=True).close()
    assert [p.name for p in log_segments(run)] == ["metrics.h5", "metrics.1.h5", "metrics.2.h5"]
    with pytest.warns(UserWarning):
        assert read_run_metrics(run)["attrs"]["continues"] == "metrics.1.h5"


def test_run_with_no_readable_segment_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.h5"):
        read_run_metrics(tmp_path)
    (tmp_path / "metrics.h5").write_bytes(b"garbage" * 100)
    with pytest.warns(UserWarning), pytest.raises(MetricsReadError,
                                                  match=f"{tmp_path}/metrics.h5: not an HDF5"):
        read_run_metrics(tmp_path)


# -- truncated logs: readers fail fast, naming the file ----------------------------------

TRUNCATION_SIZES = sorted({*range(1_000, 150_001, 7_000), 50_000, 150_000})

SWEEP = """
import json, os, shutil, sys
from pathlib import Path
from pal_hpc.io.metrics import read_metrics, read_run_metrics
src, root = Path(sys.argv[1]), Path(sys.argv[2])
for size in json.loads(sys.argv[3]):
    run = root / f"cut{size}"
    run.mkdir()
    shutil.copy(src, run / "metrics.h5")
    os.truncate(run / "metrics.h5", size)
    for reader in (read_metrics, read_run_metrics):
        try:
            reader(run / "metrics.h5" if reader is read_metrics else run)
            print(json.dumps([size, "read"]), flush=True)
        except OSError as exc:
            print(json.dumps([size, str(exc)]), flush=True)
"""


@pytest.mark.parametrize("writer", ["killed", "closed"])
def test_truncated_log_fails_fast_naming_the_file(tmp_path, writer):
    """An SWMR reader of a truncated file used to retry for ever (read_metrics hung in
    f.attrs); now every cut fails at once with the file named.  Run in a child process
    with an outer timeout so that a hang fails the test."""
    if writer == "killed":
        src = killed_run(tmp_path / "src", batches=60)
    else:
        src = tmp_path / "closed.h5"
        with MetricsLog(src, ATTRS, flush_every=0) as log:
            for b in range(60):
                log.append("evaluation", records("evaluation", 10, start=10 * b))
                log.append("system", records("system", 100, start=100 * b))
    assert src.stat().st_size > max(TRUNCATION_SIZES)
    res = subprocess.run([sys.executable, "-c", SWEEP, str(src), str(tmp_path),
                          json.dumps(TRUNCATION_SIZES)], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    results = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(results) == 2 * len(TRUNCATION_SIZES)
    for size, outcome in results:
        assert outcome.startswith(f"{tmp_path}/cut{size}/metrics.h5: truncated: {size:,} "
                                  f"bytes"), (size, outcome)
