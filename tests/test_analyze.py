"""`python -m pal_hpc.analyze` on synthetic runs written with the real MetricsLog:
the printed numbers (worked out by hand below) and the PNG plots."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys

import numpy as np
import pytest

from pal_hpc import analyze
from pal_hpc.io.metrics import MetricsLog
from pal_hpc.io.schema import EPISODES, EVALUATION, LEARNER, SYSTEM

from conftest import ROOT

PLOTS = ("learning_curve_steps.png", "learning_curve_wall.png", "throughput.png")


def write_run(run_dir, ranks, roles, eval_returns, steps_per_s, system, summary=None,
              learner_steps=None):
    """A run with evaluations every 5,000 env steps (wall = steps / steps_per_s) and the
    given system rows (wall_s, rank, env_steps_per_s, updates_per_s, replay_fill).
    Returns the open MetricsLog when there is no summary (a run in progress)."""
    layout = {"ranks": ranks, "roles": roles}
    log = MetricsLog(run_dir / "metrics.h5", {"layout": layout, "config": {"env": "CartPole-v1"},
                                              "hosts": ["n1"], "mpi_library": "MPICH"})
    steps = 5000 * np.arange(1, len(eval_returns) + 1)
    ev = np.zeros(len(steps), EVALUATION)
    ev["env_step"], ev["wall_s"] = steps, steps / steps_per_s
    ev["mean_return"], ev["std_return"], ev["episodes"] = eval_returns, 12.0, 10
    log.append("evaluation", ev)
    eps = np.zeros(40, EPISODES)
    eps["env_step"] = np.linspace(100, steps[-1], 40).astype(int)
    eps["wall_s"] = eps["env_step"] / steps_per_s
    eps["return"] = np.interp(eps["env_step"], steps, eval_returns) * 0.8
    eps["length"] = eps["return"].astype(int) + 1
    log.append("episodes", eps)
    ls = np.array(learner_steps if learner_steps is not None else steps)
    lrn = np.zeros(len(ls), LEARNER)
    lrn["env_step"], lrn["wall_s"], lrn["update"] = ls, ls / steps_per_s, ls // 8
    lrn["loss"], lrn["lr"] = np.linspace(1.0, 0.1, len(ls)), 1e-3
    log.append("learner", lrn)
    sysrows = np.zeros(len(system), SYSTEM)
    for i, (t, rank, env_s, upd_s, fill) in enumerate(system):
        sysrows[i] = (t, rank, roles[rank], env_s, upd_s, fill, 0.1, 0.5, 0.02, 0.1, 800.0)
    log.append("system", sysrows)
    log.flush()
    if summary is None:
        return log
    log.close()
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "config.json").write_text(json.dumps({"env": "CartPole-v1"}))
    return None


def wiggle(k, base, amp):
    return base + amp * (-1) ** k          # averages to `base` over an even count


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    dirs = {name: root / name for name in ("r1", "r1b", "r2", "r4")}
    # r1: one rank doing both roles; 475 first reached at the 7th evaluation.
    write_run(dirs["r1"], 1, [3], [20, 45, 110, 230, 380, 470, 490, 500, 485, 500], 1000,
              [(5.0 * k, 0, wiggle(k, 1000, 100), wiggle(k, 70, 10), 5.0 * k / 100)
               for k in range(1, 11)],
              summary={"env_steps": 50000, "wall_s": 52.3, "final_eval_return": 498.5,
                       "best_eval_return": 500.0, "ranks": 1})
    # r1b: like r1, a worse learner (never reaches 475; 300 at the 6th evaluation).
    write_run(dirs["r1b"], 1, [3], [10, 30, 80, 150, 250, 320, 380, 410, 430, 440], 1000,
              [(5.0 * k, 0, 1000, 70, 0.5) for k in range(1, 11)],
              summary={"env_steps": 50000, "wall_s": 51.0, "final_eval_return": 445.0,
                       "best_eval_return": 440.0, "ranks": 1})
    # r2: an actor rank and a learner rank.
    write_run(dirs["r2"], 2, [1, 2], [30, 90, 250, 460, 480, 495, 500, 500, 500, 500], 1800,
              [row for k in range(1, 15) for row in
               ((2.0 * k, 0, wiggle(k, 1800, 100), 0.0, 2.0 * k / 100),
                (2.0 * k + 0.5, 1, 0.0, wiggle(k, 150, 10), 2.0 * k / 100))],
              summary={"env_steps": 50000, "wall_s": 28.1, "final_eval_return": 500.0,
                       "best_eval_return": 500.0, "ranks": 2})
    # r4: three actors and a learner on two nodes, still being written (log left open).
    log = write_run(dirs["r4"], 4, [1, 1, 1, 2], [15, 40, 100, 200, 300, 350], 3000,
                    [(1.0 * k, r, (1000, 1100, 900, 0)[r] + (r < 3) * wiggle(k, 0, 50),
                      wiggle(k, 200, 20) if r == 3 else 0.0, k / (40 if r < 2 else 20))
                     for k in range(1, 11) for r in range(4)],
                    learner_steps=[10000, 20000, 31500])
    yield dirs
    log.close()


def analyze_cli(*args, cwd=ROOT) -> dict:
    """Run the analysis; returns {run name: {row label: value}} from its tables."""
    res = subprocess.run([sys.executable, "-m", "pal_hpc.analyze", *map(str, args)], cwd=cwd,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    tables, current = {}, None
    for line in res.stdout.splitlines():
        if line.startswith("== "):
            current = tables.setdefault(line.split()[1], {})
        elif line.startswith("  ") and current is not None:
            label, value = re.split(r"\s{2,}", line.strip(), maxsplit=1)
            current[label] = value
    return tables


def check_png(path) -> np.ndarray:
    """A valid, non-blank PNG; returns its pixels."""
    from matplotlib.image import imread

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    assert data[12:16] == b"IHDR", path
    width, height = struct.unpack(">II", data[16:24])
    assert width > 0 and height > 0, path
    img = imread(path)
    assert img.shape[:2] == (height, width)
    rgba = (img * 255).astype(np.uint32)
    colours = np.unique(rgba[..., 0] << 16 | rgba[..., 1] << 8 | rgba[..., 2])
    assert len(colours) >= 20, f"{path} has {len(colours)} colours: blank?"
    non_white = np.any(img[..., :3] < 0.95, axis=-1).mean()
    assert non_white > 0.01, f"{path}: only {non_white:.2%} of pixels drawn"
    return img


def test_three_runs_table_and_plots(runs, tmp_path):
    out = tmp_path / "out"
    tables = analyze_cli(runs["r1"], runs["r2"], runs["r4"], "--out", out)
    assert tables["r1"] == {
        "status": "complete", "ranks": "1", "env steps": "50,000", "wall time": "52.3 s",
        "evaluations": "10", "final eval return": "498.5", "best eval return": "500.0",
        "env steps to 475": "35,000", "seconds to 475": "35.0 s",
        "actor env steps/s (1 rank)": "1,000.0", "learner gradient batches/s (1 rank)": "70.0",
        "final replay fill": "50.0%"}
    assert tables["r2"] == {
        "status": "complete", "ranks": "2", "env steps": "50,000", "wall time": "28.1 s",
        "evaluations": "10", "final eval return": "500.0", "best eval return": "500.0",
        # 5th evaluation (480): 25,000 steps at 1,800 steps/s = 13.9 s
        "env steps to 475": "25,000", "seconds to 475": "13.9 s",
        "actor env steps/s (1 rank)": "1,800.0", "learner gradient batches/s (1 rank)": "150.0",
        "final replay fill": "28.0%"}
    assert tables["r4"] == {
        "status": "in progress or killed (no summary.json)", "ranks": "4",
        # no summary: the largest env_step (learner stream) and wall_s (learner, 31500/3000)
        "env steps": "31,500", "wall time": "10.5 s", "evaluations": "6",
        "final eval return": "350.0", "best eval return": "350.0",
        "env steps to 475": "-", "seconds to 475": "-",
        "actor env steps/s (3 ranks)": "3,000.0", "learner gradient batches/s (1 rank)": "200.0",
        # last fills: ranks 0,1 at 10/40, ranks 2,3 at 10/20
        "final replay fill": "37.5%"}
    for name in PLOTS + ("scaling.png",):
        check_png(out / name)


def test_single_runs_default_out_threshold_and_curves_follow_data(runs, tmp_path):
    # A metrics.h5 path works too; plots go next to it; one rank count: no scaling.png.
    tables = analyze_cli(runs["r1"] / "metrics.h5")
    assert tables["r1"]["env steps to 475"] == "35,000"
    for name in PLOTS:
        check_png(runs["r1"] / name)
    assert not (runs["r1"] / "scaling.png").exists()

    out = tmp_path / "r1b"
    tables = analyze_cli(runs["r1b"], "--threshold", "300", "--out", out)
    assert tables["r1b"]["env steps to 300"] == "30,000"
    assert tables["r1b"]["seconds to 300"] == "30.0 s"
    # The summary's final evaluation (445) beats every logged one (440) and counts as best.
    assert tables["r1b"]["best eval return"] == "445.0"
    assert tables["r1b"]["final eval return"] == "445.0"
    assert not (out / "scaling.png").exists()
    a = check_png(runs["r1"] / "learning_curve_steps.png")
    b = check_png(out / "learning_curve_steps.png")
    assert a.shape == b.shape and np.abs(a - b).max() > 0.1


KILLED_WRITER = """
import sys, time
sys.path.insert(0, {tests!r})
from pathlib import Path
from test_analyze import write_run
log = write_run(Path({run_dir!r}), 1, [3], [50, 200, 480, 470], 2000,
                [(float(k), 0, 2000.0, 100.0, k / 10) for k in range(1, 6)])
print("written", flush=True)
time.sleep(60)
"""


def test_killed_run_and_several_runs_default_out(runs, tmp_path):
    killed = tmp_path / "killed"
    code = KILLED_WRITER.format(tests=str(ROOT / "tests"), run_dir=str(killed))
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "written", proc.stderr.read()
    finally:
        proc.kill()                               # SIGKILL mid-run: no close, no summary
        proc.wait(timeout=30)
    tables = analyze_cli(runs["r1"], killed, cwd=tmp_path)
    assert tables["killed"] == {
        "status": "in progress or killed (no summary.json)", "ranks": "1",
        "env steps": "20,000", "wall time": "10.0 s", "evaluations": "4",
        "final eval return": "470.0", "best eval return": "480.0",
        "env steps to 475": "15,000", "seconds to 475": "7.5 s",
        "actor env steps/s (1 rank)": "2,000.0", "learner gradient batches/s (1 rank)": "100.0",
        "final replay fill": "50.0%"}
    # Several runs go to ./analysis; one rank count only: no scaling plot.
    assert sorted(p.name for p in (tmp_path / "analysis").iterdir()) == sorted(PLOTS)


def test_missing_metrics_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        analyze.main([str(tmp_path)])
    assert exc.value.code == 2
    assert "no metrics.h5" in capsys.readouterr().err
