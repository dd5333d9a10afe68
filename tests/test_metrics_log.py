"""The HDF5 metrics log: written by MetricsLog, read back by h5py, read_metrics, h5dump,
by a second process while the writer is open, and after the writer was killed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

from pal_hpc.io.metrics import MetricsLog, read_metrics, run_attributes
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
                                       ATTRS["mpi_library"])}
    MetricsLog(path, attrs).close()
    got = read_metrics(path)["attrs"]
    assert got == {**attrs, "note": ""}
    assert isinstance(got["seed"], int) and isinstance(got["lr"], float)
    assert set(got["versions"]) >= {"python", "numpy", "torch", "gymnasium", "h5py",
                                    "mpi4py", "pal_hpc"}
    assert got["versions"]["h5py"] == h5py.__version__
    assert got["start_time"][:2] == "20" and "T" in got["start_time"]
    assert isinstance(got["git_commit"], str)
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
