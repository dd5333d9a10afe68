"""`python -m pal_hpc.analyze` on synthetic runs written with the real MetricsLog:
the printed numbers (worked out by hand below) and the PNG plots; runs grouped by
(algo, env) with their own thresholds; segmented, truncated, garbage and read-only runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from pal_hpc import analyze
from pal_hpc.io.metrics import MetricsLog, open_run_log
from pal_hpc.io.schema import EPISODES, EVALUATION, LEARNER, SYSTEM

from conftest import ROOT

PLOTS = ("learning_curve_steps.png", "learning_curve_wall.png", "throughput.png")
CARTPOLE = {"algo": "dqn", "env": "CartPole-v1", "target_return": 475.0}


def write_run(run_dir, ranks, roles, eval_returns, steps_per_s, system, summary=None,
              learner_steps=None, config=CARTPOLE, extra_layout=None):
    """A run with evaluations every 5,000 env steps (wall = steps / steps_per_s) and the
    given system rows (wall_s, rank, env_steps_per_s, updates_per_s, replay_fill).
    Returns the open MetricsLog when there is no summary (a run in progress)."""
    layout = {"ranks": ranks, "roles": roles, **(extra_layout or {})}
    log = MetricsLog(run_dir / "metrics.h5", {"layout": layout, "config": config,
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
    lrn["loss"], lrn["grad_norm"] = np.linspace(1.0, 0.1, len(ls)), 1.0
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
    (run_dir / "config.json").write_text(json.dumps(config))
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
    # r1b: like r1, a worse learner (never reaches 475; 300 at the 6th evaluation), run
    # without a target_return.
    write_run(dirs["r1b"], 1, [3], [10, 30, 80, 150, 250, 320, 380, 410, 430, 440], 1000,
              [(5.0 * k, 0, 1000, 70, 0.5) for k in range(1, 11)],
              summary={"env_steps": 50000, "wall_s": 51.0, "final_eval_return": 445.0,
                       "best_eval_return": 440.0, "ranks": 1},
              config={"algo": "dqn", "env": "CartPole-v1", "target_return": None})
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


def analyze_cli(*args, cwd=ROOT, status=0, full=False):
    """Run the analysis; returns {run name: {row label: value}} from its tables (and the
    completed process with `full`)."""
    res = subprocess.run([sys.executable, "-m", "pal_hpc.analyze", *map(str, args)], cwd=cwd,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == status, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    tables, current = {}, None
    for line in res.stdout.splitlines():
        if line.startswith("== "):
            current = tables.setdefault(line.split()[1], {})
        elif line.startswith("  ") and current is not None:
            label, value = re.split(r"\s{2,}", line.strip(), maxsplit=1)
            current[label] = value
    return (tables, res) if full else tables


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
    assert analyze.main([str(tmp_path)]) == 1
    assert f"{tmp_path}: no metrics.h5" in capsys.readouterr().err


def acrobot_run(run_dir, ranks, returns, target):
    """A finished Acrobot run: evaluations every 5,000 steps at 1,000 steps/s."""
    write_run(run_dir, ranks, [3] + [1] * (ranks - 1), returns, 1000,
              [(1.0 * k, r, 500.0, 50.0 * (r == 0), 0.5) for k in range(1, 5)
               for r in range(ranks)],
              summary={"env_steps": 5000 * len(returns), "wall_s": 5.0 * len(returns),
                       "ranks": ranks},
              config={"algo": "dqn", "env": "Acrobot-v1", "target_return": target})


def test_runs_grouped_by_algo_and_env_each_with_its_own_threshold(runs, tmp_path):
    a1, a4 = tmp_path / "a1", tmp_path / "a4"
    acrobot_run(a1, 1, [-500, -400, -200, -120, -95, -80], target=-100.0)
    acrobot_run(a4, 4, [-480, -300, -150, -110, -70], target=None)
    out = tmp_path / "out"
    tables, res = analyze_cli(runs["r1"], a1, runs["r2"], a4, "--threshold", "-140",
                              "--out", out, full=True)
    # Each run against its own target_return; --threshold only where there is none.
    assert (tables["r1"]["env steps to 475"], tables["r2"]["env steps to 475"]) == \
        ("35,000", "25,000")
    assert tables["a1"]["env steps to -100"] == "25,000"
    assert tables["a4"]["env steps to -140"] == "20,000"
    assert "### dqn on CartPole-v1: 2 runs" in res.stdout
    assert "### dqn on Acrobot-v1: 2 runs" in res.stdout
    # One set of plots per group, each with its own scaling plot (1 vs 2, 1 vs 4 ranks).
    assert sorted(p.name for p in out.iterdir()) == ["dqn-Acrobot-v1", "dqn-CartPole-v1"]
    for group in out.iterdir():
        for name in PLOTS + ("scaling.png",):
            check_png(group / name)
    # No target_return and no --threshold: no threshold at all (not CartPole's 475).
    tables = analyze_cli(a4, runs["r1"], "--out", tmp_path / "out2")
    assert tables["a4"]["env steps to threshold (none given)"] == "-"
    assert tables["r1"]["env steps to 475"] == "35,000"


def planned_run(run_dir, ranks, plan=None):
    """An Acrobot run of `ranks` ranks (500 env steps/s per actor rank), with the
    start-up planner's prediction in its summary when `plan` is given."""
    summary = {"env_steps": 20000, "wall_s": 20.0, "ranks": ranks}
    if plan is not None:
        summary["plan"] = plan
    write_run(run_dir, ranks, [3] + [1] * (ranks - 1), [-400, -200, -100, -90], 1000,
              [(1.0 * k, r, 500.0, 50.0 * (r == 0), 0.5) for k in range(1, 5)
               for r in range(ranks)],
              summary=summary, config={"algo": "dqn", "env": "Acrobot-v1"})


def red_pixels(img) -> int:
    """Pixels of matplotlib's tab:red (214, 39, 40), the predictions' markers."""
    rgb = (img[..., :3] * 255).astype(int)
    return int((np.abs(rgb - [214, 39, 40]).max(axis=-1) < 30).sum())


def test_scaling_plot_shows_the_planners_prediction(tmp_path):
    plan = lambda s, g: {"env_steps_per_s": s, "gradient_batches_per_s": g,  # noqa: E731
                         "describe": "1 learner + 1 actor per node", "learners": 1}
    planned, plain = tmp_path / "planned", tmp_path / "plain"
    planned_run(planned / "p1", 1, plan(450.0, 40.0))
    planned_run(planned / "p2", 2, plan(620.5, 55.0))
    planned_run(plain / "q1", 1)
    planned_run(plain / "q2", 2)
    tables = analyze_cli(planned / "p1", planned / "p2", "--out", planned / "out")
    assert tables["p2"]["planner's prediction"] == \
        "620.5 env steps/s, 55.0 gradient batches/s (1 learner + 1 actor per node)"
    with_plan = check_png(planned / "out" / "scaling.png")
    tables = analyze_cli(plain / "q1", plain / "q2", "--out", plain / "out")
    assert "planner's prediction" not in tables["q2"]
    without = check_png(plain / "out" / "scaling.png")
    assert red_pixels(with_plan) > 50 and red_pixels(without) == 0


def test_read_only_run_dir(runs, tmp_path):
    run = tmp_path / "ro"
    shutil.copytree(runs["r1"], run)
    for name in PLOTS:
        (run / name).unlink(missing_ok=True)
    (run / PLOTS[0]).mkdir()        # unwritable even for root, who ignores the mode bits
    os.chmod(run, 0o555)
    try:
        tables, res = analyze_cli(run, status=1, full=True)
        assert tables["ro"]["env steps to 475"] == "35,000"     # the table still comes
        assert f"cannot write the plots to {run}" in res.stderr
        assert "pass --out DIR" in res.stderr
        out = tmp_path / "elsewhere"
        analyze_cli(run, "--out", out)
        for name in PLOTS:
            check_png(out / name)
    finally:
        os.chmod(run, 0o755)


def test_garbage_truncated_and_missing_runs_are_named_and_the_rest_analysed(runs, tmp_path):
    """A truncated log used to hang the analysis (an SWMR reader retrying for ever); the
    outer timeout of analyze_cli fails the test if it does."""
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "metrics.h5").write_bytes(np.random.default_rng(1).bytes(30_000))
    big = tmp_path / "big"                      # marked open for writing, like a killed run
    log = write_run(big, 1, [3], [50, 200, 480], 2000,
                    [(0.01 * k, 0, 2000.0, 100.0, 0.5) for k in range(3000)])
    cuts = []
    try:
        assert (big / "metrics.h5").stat().st_size > 150_000
        for size in sorted({*range(1_000, 150_001, 7_000), 50_000, 150_000}):
            cut = tmp_path / f"cut{size}"
            cut.mkdir()
            shutil.copy(big / "metrics.h5", cut / "metrics.h5")
            os.truncate(cut / "metrics.h5", size)
            cuts.append((cut, size))
    finally:
        log.close()
    not_a_run = tmp_path / "notes.txt"
    not_a_run.write_text("not a run\n")
    missing = tmp_path / "missing"
    tables, res = analyze_cli(garbage, runs["r1"], *(c for c, _ in cuts), not_a_run, missing,
                              big, "--out", tmp_path / "out", status=1, full=True)
    assert sorted(tables) == ["big", "r1"]
    assert tables["r1"]["env steps to 475"] == "35,000"
    errors = res.stderr.splitlines()
    assert f"error: {garbage}/metrics.h5: not an HDF5 file (no HDF5 signature)" in errors
    for cut, size in cuts:
        assert any(e.startswith(f"error: {cut}/metrics.h5: truncated: {size:,} bytes")
                   for e in errors), (size, res.stderr)
    assert f"error: {not_a_run}: not an HDF5 file (no HDF5 signature)" in errors
    assert f"error: {missing}: no such run directory or metrics.h5" in errors
    assert len(errors) == len(cuts) + 3
    check_png(tmp_path / "out" / "learning_curve_steps.png")


def test_segmented_run_is_analysed_as_one_run(tmp_path):
    run = tmp_path / "seg"
    code = KILLED_WRITER.format(tests=str(ROOT / "tests"), run_dir=str(run))
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "written", proc.stderr.read()
    finally:
        proc.kill()
        proc.wait(timeout=30)
    with pytest.warns(UserWarning, match="metrics.1.h5"):
        log = open_run_log(run, {"config": CARTPOLE, "layout": {"ranks": 1}}, resume=True)
    with log:      # the resumed run: two more evaluations, the second one solves it
        ev = np.zeros(2, EVALUATION)
        ev["env_step"], ev["wall_s"], ev["mean_return"] = [25000, 30000], [12.5, 15.0], \
            [460.0, 490.0]
        log.append("evaluation", ev)
    tables = analyze_cli(run, "--out", tmp_path / "out")
    assert tables["seg"] == {
        "status": "in progress or killed (no summary.json)", "ranks": "1",
        "env steps": "30,000", "wall time": "15.0 s", "evaluations": "6",
        "final eval return": "490.0", "best eval return": "490.0",
        "env steps to 475": "15,000", "seconds to 475": "7.5 s",
        "actor env steps/s (1 rank)": "2,000.0", "learner gradient batches/s (1 rank)": "100.0",
        "final replay fill": "50.0%", "log segments": "2"}
    # A damaged first segment: the run is still analysed from the rest, with a warning.
    os.truncate(run / "metrics.h5", 5_000)
    tables, res = analyze_cli(run / "metrics.h5", "--out", tmp_path / "out", full=True)
    assert tables["seg"]["evaluations"] == "2"
    assert tables["seg"]["log segments"] == "2 (1 unreadable: metrics.h5)"
    assert f"warning: metrics log segment {run}/metrics.h5 skipped: truncated" in res.stderr


def test_paac_run_is_labelled_masters_and_env_workers(tmp_path):
    """An on-policy (PAAC) run: its log's layout names masters and env workers; only the
    master writes system rows (role 3, no replay), so the table shows the job's env
    steps/s and gradient batches/s under those names, with no actor, learner or replay
    rows."""
    run = tmp_path / "paac"
    write_run(run, 4, [3, 1, 1, 1], [-21.0, -20.5, -19.0], 1000,
              [(5.0 * k, 0, wiggle(k, 900, 50), wiggle(k, 5.5, 0.5), np.nan)
               for k in range(1, 9)],
              summary={"env_steps": 15000, "wall_s": 15.2, "final_eval_return": -19.0,
                       "best_eval_return": -19.0, "ranks": 4},
              config={"algo": "paac", "env": "ALE/Pong-v5", "target_return": None},
              extra_layout={"masters": 1, "env_workers": 3, "num_envs": [33]})
    table = analyze_cli(run, "--out", tmp_path / "out")["paac"]
    assert table["env steps/s (1 master, 3 env workers)"] == "900.0"
    assert table["master gradient batches/s (1 master)"] == "5.5"
    assert not [k for k in table if "actor" in k or "learner" in k or "replay" in k], table


def test_training_returns_are_a_rolling_mean_in_end_order():
    ep = np.zeros(5, EPISODES)
    ep["env_step"] = [10, 30, 20, 40, 50]
    ep["wall_s"] = [1.0, 3.0, 2.0, 4.0, 5.0]          # row 2 ended before row 1
    ep["return"] = [1.0, 3.0, 2.0, 4.0, 5.0]
    run = analyze.Run("r", ROOT, {"episodes": ep}, None, None)
    got = analyze.training_returns(run, window=2)
    np.testing.assert_array_equal(got["env_step"], [10, 20, 30, 40, 50])
    np.testing.assert_allclose(got["mean_return"], [1.0, 1.5, 2.5, 3.5, 4.5])
    # Two actors' rows: the env-step estimate of one runs ahead of the other's.
    ep["env_step"] = [10, 40, 20, 50, 30]
    by_step = analyze.training_returns(run, window=2, by="env_step")
    np.testing.assert_array_equal(by_step["env_step"], [10, 20, 30, 40, 50])
    np.testing.assert_array_equal(by_step["wall_s"], [1.0, 2.0, 5.0, 3.0, 4.0])
    np.testing.assert_allclose(by_step["mean_return"], [1.0, 1.5, 3.5, 4.0, 3.5])
    assert np.all(np.diff(analyze.training_returns(run, window=2)["wall_s"]) > 0)
    assert analyze.training_returns(analyze.Run("e", ROOT, {"episodes": ep[:0]}, None,
                                                None)) is None


def test_a_reference_stands_beside_the_run_at_its_env_steps(runs, tmp_path):
    """--reference LABEL=VALUE@STEPS: a table row with the run's own training return
    and nearest greedy evaluation at those steps, and the level drawn on the curves."""
    out, plain = tmp_path / "ref", tmp_path / "plain"
    tables = analyze_cli(runs["r1"], "--reference", "their paper=450@30_000",
                         "--reference", "a level=300", "--out", out)
    # r1's episodes: 40 from 100 to 50,000 env steps, 0.8 x the evaluation curve; those
    # ended by 30,000 are fewer than the window of 100, so the rolling mean is their mean.
    ep = np.linspace(100, 50000, 40).astype(int)
    evals = [20, 45, 110, 230, 380, 470, 490, 500, 485, 500]
    steps = 5000 * np.arange(1, 11)
    training = (np.interp(ep, steps, evals) * 0.8)[ep <= 30000].mean()
    assert tables["r1"]["reference: their paper"] == (
        f"450 (training) at 30,000 env steps; this run there: training {training:.1f}, "
        f"greedy 470.0 (at 30,000)")
    assert tables["r1"]["reference: a level"] == "300 (training)"
    analyze_cli(runs["r1"], "--out", plain)
    with_refs = check_png(out / "learning_curve_steps.png")
    without = check_png(plain / "learning_curve_steps.png")
    assert with_refs.shape == without.shape and np.abs(with_refs - without).max() > 0.1
    # A reference past the run's end says so instead of giving a value.
    tables = analyze_cli(runs["r1"], "--reference", "later=1@1e6", "--out", out)
    assert tables["r1"]["reference: later"] == \
        "1 (training) at 1,000,000 env steps; this run stopped at 50,000"


def test_at_steps_prints_each_runs_training_and_greedy_returns_there(runs, tmp_path):
    """--at: a Markdown table per group, two rows a run, worked out by hand; a step past
    a run's end is "-", and bad steps are refused naming the value."""
    _, res = analyze_cli(runs["r1"], runs["r1b"], "--at", "30_000,1e4,1e4,9e4", "--out",
                         tmp_path, full=True)
    ep = np.linspace(100, 50000, 40).astype(int)
    steps = 5000 * np.arange(1, 11)

    def training(evals, by):
        return (np.interp(ep, steps, evals) * 0.8)[ep <= by].mean()

    r1 = [20, 45, 110, 230, 380, 470, 490, 500, 485, 500]
    r1b = [10, 30, 80, 150, 250, 320, 380, 410, 430, 440]
    table = [line for line in res.stdout.splitlines() if line.startswith("|")]
    assert table == [
        "| run | env steps | 10k | 30k | 90k |",
        "|---|---|---:|---:|---:|",
        f"| r1 | training return (last 100 episodes) | {training(r1, 10000):.1f} | "
        f"{training(r1, 30000):.1f} | - |",
        "| | greedy evaluation (nearest) | 45.0 | 470.0 | - |",
        f"| r1b | training return (last 100 episodes) | {training(r1b, 10000):.1f} | "
        f"{training(r1b, 30000):.1f} | - |",
        "| | greedy evaluation (nearest) | 30.0 | 320.0 | - |"]
    for bad, message in (("1e6,ten", "'ten' is not a number of env steps"),
                         ("0", "'0' is not a whole number of env steps >= 1"),
                         ("2.5", "'2.5' is not a whole number")):
        res = subprocess.run([sys.executable, "-m", "pal_hpc.analyze", str(runs["r1"]),
                              "--at", bad, "--out", str(tmp_path / "bad")],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and f"--at: {message}" in res.stderr, res.stderr
        assert not (tmp_path / "bad").exists()      # refused before anything was written


@pytest.mark.parametrize("text, message", [
    ("paper", "expected LABEL=VALUE[@STEPS]"),
    ("=10", "expected LABEL=VALUE[@STEPS]"),
    ("paper=ten", "VALUE of 'paper=ten' is not a number: 'ten'"),
    ("paper=nan", "VALUE of 'paper=nan' must be finite"),
    ("paper=10@many", "STEPS of 'paper=10@many' is not a number: 'many'"),
    ("paper=10@2.5", "STEPS of 'paper=10@2.5' must be a whole number >= 0"),
])
def test_a_bad_reference_is_refused_naming_the_value(runs, tmp_path, text, message):
    res = subprocess.run([sys.executable, "-m", "pal_hpc.analyze", str(runs["r1"]),
                          "--reference", text, "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert f"--reference: {message}" in res.stderr, res.stderr
    assert not any(tmp_path.iterdir())              # refused before anything was written


def test_published_results_come_with_their_algo_and_env(tmp_path):
    """A MinAtar DQN run gets the MinAtar paper's value; --no-published drops it; a
    PAAC run on the same game does not get DQN's."""
    def minatar(name, algo):
        write_run(tmp_path / name, 2, [1, 2], [1.0, 3.0, 5.0], 500,
                  [(1.0 * k, r, 500.0, 500.0 * r, 0.5) for k in range(1, 4) for r in range(2)],
                  summary={"env_steps": 15000, "wall_s": 30.0, "ranks": 2},
                  config={"algo": algo, "env": "MinAtar/Breakout-v1"})
    minatar("dqn", "dqn")
    minatar("paac", "paac")
    ref = analyze.PUBLISHED[("dqn", "MinAtar/Breakout-v1")][0]
    assert (ref.value, ref.steps, ref.measure, ref.approx) == (10.0, 5_000_000, "training", True)
    tables = analyze_cli(tmp_path / "dqn", tmp_path / "paac", "--out", tmp_path / "out")
    assert tables["dqn"]["reference: MinAtar paper's DQN (on -v0: all 6 actions)"] == \
        "about 10 (training) at 5,000,000 env steps; this run stopped at 15,000"
    assert not [k for k in tables["paac"] if k.startswith("reference")]
    tables = analyze_cli(tmp_path / "dqn", "--no-published", "--out", tmp_path / "out2")
    assert not [k for k in tables["dqn"] if k.startswith("reference")]
    # Every published entry names where it comes from and says what it compares with.
    for (algo, env), refs in analyze.PUBLISHED.items():
        for r in refs:
            assert r.source and r.measure in ("training", "evaluation") and r.steps, (algo, env)


def test_seeds_are_one_curve_with_their_spread(runs, tmp_path):
    """--seeds: the group's runs averaged on the env steps they all reached, printed
    (mean, lowest .. highest) and drawn; settings that differ beyond the seed named."""
    out = tmp_path / "seeds"
    tables, res = analyze_cli(runs["r1"], runs["r1b"], "--seeds", "--out", out, full=True)
    # Both evaluate every 5,000 steps up to 50,000: r1 ends at 500, r1b at 440.
    assert "greedy evaluation at 50,000 env steps: mean 470.0 (440.0 .. 500.0) over 2 runs" \
        in res.stdout, res.stdout
    # Training: 40 episodes each, fewer than the window: the mean of all of them by the end.
    ep = np.linspace(100, 50000, 40).astype(int)
    steps = 5000 * np.arange(1, 11)
    ends = [(np.interp(ep, steps, ev) * 0.8).mean() for ev in
            ([20, 45, 110, 230, 380, 470, 490, 500, 485, 500],
             [10, 30, 80, 150, 250, 320, 380, 410, 430, 440])]
    assert (f"training return at 50,000 env steps: mean {np.mean(ends):.1f} "
            f"({min(ends):.1f} .. {max(ends):.1f}) over 2 runs") in res.stdout, res.stdout
    assert "warning" not in res.stderr               # only target_return differs
    with_seeds = check_png(out / "learning_curve_seeds.png")
    assert with_seeds.shape[0] > 100
    # Without --seeds: no such plot; with runs of different settings: a warning naming them.
    analyze_cli(runs["r1"], runs["r1b"], "--out", tmp_path / "plain")
    assert not (tmp_path / "plain" / "learning_curve_seeds.png").exists()
    for name, gamma in (("g1", 0.9), ("g2", 0.99)):
        write_run(tmp_path / name, 1, [3], [10, 20, 30], 1000, [(1.0, 0, 1000, 70, 0.5)],
                  summary={"env_steps": 15000, "wall_s": 15.0, "ranks": 1},
                  config={**CARTPOLE, "gamma": gamma, "seed": len(name)})
    _, res = analyze_cli(tmp_path / "g1", tmp_path / "g2", "--seeds", "--out",
                         tmp_path / "g", full=True)
    assert "warning: --seeds: these runs differ in more than the seed: gamma" in res.stderr
    assert "greedy evaluation at 15,000 env steps: mean 30.0 (30.0 .. 30.0)" in res.stdout


def test_exported_curves_stand_in_for_the_run(runs, tmp_path):
    """--export-curves writes a small JSON of a run's curves; read back as a RUN it gives
    the same table rows that do not need the system stream, the same curves and works
    with --seeds; a file that is not one is named, the others still analysed."""
    export = tmp_path / "curves"
    full = analyze_cli(runs["r1"], runs["r2"], "--export-curves", export,
                       "--out", tmp_path / "a")
    files = sorted(p.name for p in export.iterdir())
    assert files == ["r1.curves.json", "r2.curves.json"]
    assert all((export / f).stat().st_size < 20_000 for f in files)
    back = analyze_cli(export / "r1.curves.json", export / "r2.curves.json",
                       "--out", tmp_path / "b")
    for name in ("r1", "r2"):
        for row in ("status", "ranks", "env steps", "wall time", "evaluations",
                    "final eval return", "best eval return", "env steps to 475",
                    "seconds to 475"):
            assert back[name][row] == full[name][row], (name, row)
    # The plots of the curves alone: the learning curves, no throughput (not kept).
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == \
        ["learning_curve_steps.png", "learning_curve_wall.png"]
    a = check_png(tmp_path / "a" / "learning_curve_steps.png")
    b = check_png(tmp_path / "b" / "learning_curve_steps.png")
    assert a.shape == b.shape and np.abs(a - b).mean() < 0.01      # the same curves
    run = analyze.load_curves(export / "r1.curves.json")
    np.testing.assert_allclose(analyze.training_returns(run, by="env_step")["mean_return"],
                               analyze.training_returns(analyze.load_run(runs["r1"]),
                                                        by="env_step")["mean_return"],
                               atol=1e-4)
    _, res = analyze_cli(export / "r1.curves.json", runs["r1b"], "--seeds", "--out",
                         tmp_path / "c", full=True)
    assert "greedy evaluation at 50,000 env steps: mean 470.0 (440.0 .. 500.0)" in res.stdout
    # Not a curves file, another version, a column missing: named, exit 1, rest analysed.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.curves.json").write_text("{not json")
    doc = json.loads((export / "r1.curves.json").read_text())
    (bad / "v9.curves.json").write_text(json.dumps({**doc, "version": 9}))
    (bad / "nocol.curves.json").write_text(json.dumps(
        {**doc, "training": {k: v for k, v in doc["training"].items() if k != "wall_s"}}))
    tables, res = analyze_cli(bad / "x.curves.json", bad / "v9.curves.json",
                              bad / "nocol.curves.json", export / "r2.curves.json",
                              "--out", tmp_path / "d", status=1, full=True)
    assert f"{bad / 'x.curves.json'}: not a readable curves file" in res.stderr
    assert f"{bad / 'v9.curves.json'}: curves format version 9" in res.stderr
    assert f"{bad / 'nocol.curves.json'}: 'training' must have the columns" in res.stderr
    assert list(tables) == ["r2"]
