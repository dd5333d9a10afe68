"""`--tensorboard`: rank 0 mirrors the HDF5 metrics log's rows into TensorBoard event
files in <run_dir>/tensorboard, read back here with tensorboard's own reader
(EventAccumulator) and compared with the HDF5 log, row for row."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import ROOT, mpi_env, pal_cmd
from pal_hpc.cluster.launch import pal_main
from pal_hpc.io.metrics import read_metrics
from pal_hpc.io.schema import EPISODES, SYSTEM
from pal_hpc.io.tensorboard import TensorBoardMirror, check_tensorboard_dir
from pal_hpc.options import ConfigError


def scalars(log_dir) -> dict:
    """{tag: [(step, value, wall_time), ...]} of every scalar in log_dir, all kept."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def f32(values) -> list:
    """Values as TensorBoard stores them (float32)."""
    return [float(np.float32(v)) for v in values]


# ---- the mirror on its own --------------------------------------------------------------

def test_rows_out_of_step_order_keep_every_value_with_increasing_steps(tmp_path):
    mirror = TensorBoardMirror(tmp_path / "tb", wall_s_now=10.0)
    first = np.array([(300, 1.0, 0, 10.0, 10), (100, 2.0, 1, 20.0, 20), (100, 3.0, 2, 30.0, 30)],
                     dtype=EPISODES)
    second = np.array([(50, 4.0, 0, 40.0, 40)], dtype=EPISODES)     # behind the first block
    system = np.array([(1.5, 0, 3, 100.0, 7.0, np.nan, np.nan, np.nan, np.nan, np.nan, 50.0),
                       (1.5, 1, 1, 200.0, 0.0, 0.5, 0.1, 0.2, 0.3, 0.4, 60.0)], dtype=SYSTEM)
    mirror.write("episodes", first)
    mirror.write("episodes", second)
    mirror.write("system", system)
    mirror.close()
    mirror.close()                                   # twice is harmless
    got = scalars(tmp_path / "tb")
    ret = got["episodes/return"]
    # In step order within a block; a step behind the last is raised past it.
    assert [s for s, _, _ in ret] == [100, 101, 300, 301]
    assert [v for _, v, _ in ret] == [20.0, 30.0, 10.0, 40.0]
    assert [v for _, v, _ in got["episodes/length"]] == [20, 30, 10, 40]
    # The row's own wall time: wall_s after the run's start (10 s before opening).
    assert [w - ret[2][2] for _, _, w in ret] == pytest.approx([1.0, 2.0, 0.0, 3.0], abs=1e-3)
    assert abs(ret[0][2] - (time.time() - 10.0 + 2.0)) < 60
    assert "episodes/actor" not in got and "episodes/env_step" not in got
    # System rows: per rank, at milliseconds since the start; NaN cells left out.
    assert got["system/env_steps_per_s/rank0"] == [(1500, 100.0, pytest.approx(got[
        "system/env_steps_per_s/rank0"][0][2]))]
    assert [v for _, v, _ in got["system/env_steps_per_s/rank1"]] == [200.0]
    assert "system/replay_fill/rank0" not in got
    assert f32([0.5]) == [v for _, v, _ in got["system/replay_fill/rank1"]]
    assert not any(t.startswith("system/role") or t.startswith("system/rank/") for t in got)


def test_an_unusable_tensorboard_dir_is_refused_naming_it(tmp_path):
    (tmp_path / "tensorboard").write_text("not a directory")
    with pytest.raises(ConfigError, match=r"tensorboard: .*tensorboard is a file"):
        check_tensorboard_dir(tmp_path)
    ok = tmp_path / "ok"
    assert check_tensorboard_dir(ok) == ok / "tensorboard" and (ok / "tensorboard").is_dir()


def test_without_the_flag_nothing_imports_tensorboard():
    code = ("import sys, pal_hpc.main, pal_hpc.runtime.run, pal_hpc.runtime.onpolicy, "
            "pal_hpc.runtime.telemetry, pal_hpc.io.tensorboard, pal_hpc.io.rundir\n"
            "bad = [m for m in sys.modules if m.split('.')[0] == 'tensorboard' "
            "or m.startswith('torch.utils.tensorboard')]\n"
            "assert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


# ---- real runs under mpiexec ------------------------------------------------------------

def check_run(run_dir, system_ranks) -> None:
    """The event files of a finished run hold exactly the HDF5 log's rows."""
    files = sorted((run_dir / "tensorboard").iterdir())
    assert len(files) == 1 and files[0].name.startswith("events.out.tfevents."), files
    elsewhere = [p for p in run_dir.rglob("events.out.tfevents.*") if p.parent.name != "tensorboard"]
    assert not elsewhere
    log = read_metrics(run_dir / "metrics.h5")
    got = scalars(run_dir / "tensorboard")
    ep = log["episodes"]
    assert len(ep) > 10
    for col in ("return", "length"):
        tb = got[f"episodes/{col}"]
        assert len(tb) == len(ep)
        assert sorted(v for _, v, _ in tb) == sorted(f32(ep[col]))
    steps = [s for s, _, _ in got["episodes/return"]]
    assert steps == sorted(set(steps)) and steps[0] >= ep["env_step"].min()
    learner = log["learner"]
    assert len(learner) > 2
    metric_names = [n for n in learner.dtype.names if n not in ("update", "wall_s", "env_step")]
    for col in ["update", *metric_names]:
        tb = got[f"learner/{col}"]
        # One learner writes these rows, in order: the same values in the same order.
        want = [(s, v) for s, v in zip(learner["env_step"], f32(learner[col]))
                if not np.isnan(v)]
        assert [v for _, v, _ in tb] == [v for _, v in want], col
        assert all(s >= w for (s, _, _), (w, _) in zip(tb, want))
    ev = log["evaluation"]
    assert len(ev) >= 1
    assert [v for _, v, _ in got["evaluation/mean_return"]] == f32(ev["mean_return"])
    assert [v for _, v, _ in got["evaluation/episodes"]] == f32(ev["episodes"])
    sysrows = log["system"]
    assert sorted(set(sysrows["rank"].tolist())) == system_ranks
    for r in system_ranks:
        mine = sysrows[sysrows["rank"] == r]
        tb = got[f"system/env_steps_per_s/rank{r}"]
        assert sorted(v for _, v, _ in tb) == sorted(f32(mine["env_steps_per_s"]))


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2])
def test_off_policy_run_writes_the_log_rows_as_event_files(tmp_path, n):
    run_dir = tmp_path / "run"
    proc = subprocess.run(pal_cmd(n, run_dir, "--total-steps", "3000", "--eval-every", "1500",
                                  "--tensorboard"),
                          cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_run(run_dir, list(range(n)))


@pytest.mark.mpi
def test_paac_run_writes_the_log_rows_as_event_files(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(pal_main(2, "--algo", "paac", "--hidden", "32", "32",
                                   "--eval-episodes", "2", "--progress-every", "0.5",
                                   "--total-steps", "6000", "--eval-every", "3000",
                                   "--run-dir", str(run_dir), "--tensorboard"),
                          cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_run(run_dir, [0])                  # one master: the only rank with system rows


@pytest.mark.mpi
def test_an_unwritable_tensorboard_dir_stops_the_job_before_work(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "tensorboard").write_text("a file where the event files would go")
    proc = subprocess.run(pal_cmd(2, run_dir, "--total-steps", "3000", "--tensorboard"),
                          cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"tensorboard: {run_dir / 'tensorboard'} is a file" in proc.stderr
    assert not (run_dir / "metrics.h5").exists() and not (run_dir / "summary.json").exists()
