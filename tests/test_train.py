"""Smoke runs of the real entry point (`python -m pal_hpc.main`) under mpiexec."""

import json
import time

import numpy as np
import pytest

from pal_hpc.io.metrics import read_metrics


pytestmark = pytest.mark.mpi

SMALL = ["--total-steps", "3000", "--learning-starts", "500", "--eval-every", "1000",
         "--eval-episodes", "3", "--hidden", "32", "32", "--replay-capacity", "5000",
         "--progress-every", "1", "--replay-ratio", "16"]
KEYS = {"env_steps", "updates", "wall_s", "best_eval_return", "final_eval_return",
        "time_to_target_s", "steps_to_target", "ranks", "actors", "learners"}


def run_main(mpi, nprocs, tmp_path, *flags, env=None, timeout=180):
    return mpi(nprocs, "-m", "pal_hpc.main", *SMALL, "--run-dir", str(tmp_path / "run"), *flags,
               timeout=timeout, env=env)


@pytest.mark.parametrize("nprocs,extra,nodes,actors,learners", [
    (1, [], 1, 1, 1),                                   # one rank is actor and learner
    (4, [], 1, 3, 1),                                   # the default split
    (4, ["--ranks-per-node", "2"], 2, 2, 2),            # two (virtual) nodes, a learner on each
])
def test_training_runs_end_to_end(mpi, tmp_path, nprocs, extra, nodes, actors, learners):
    proc = run_main(mpi, nprocs, tmp_path, *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert KEYS <= summary.keys()
    assert summary["ranks"] == nprocs and summary["nodes"] == nodes
    assert summary["actors"] == actors and summary["learners"] == learners
    assert summary["env_steps"] >= 3000
    assert summary["updates"] > 0
    assert summary["learner_params_identical"] is True
    # The two-sided rate limit holds sampled/inserted near --replay-ratio (16, batch 64).
    ratio = summary["updates"] * 64 / summary["env_steps"]
    assert 0.3 * 16 <= ratio <= 1.05 * 16, ratio
    assert summary["final_eval_return"] is not None and summary["evaluations"]
    assert proc.stdout.count("summary: ") == 1           # printed once, by rank 0
    assert "steps" in proc.stdout and "updates" in proc.stdout   # progress lines
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["total_steps"] == 3000
    # The metrics log holds every stream, from every rank, and the run's attributes.
    m = read_metrics(tmp_path / "run" / "metrics.h5")
    assert m["attrs"]["layout"]["ranks"] == nprocs and m["attrs"]["config"]["total_steps"] == 3000
    # Every episode the actors finished (counted in the job-wide counters) is logged.
    assert len(m["episodes"]) == summary["episodes"] > 0
    assert set(m["episodes"]["actor"]) == set(range(actors))
    # An episode's (estimated) env step never passes the budget.
    assert 0 <= m["episodes"]["env_step"].min() and m["episodes"]["env_step"].max() <= 3000
    assert len(m["learner"]) > 0 and np.all(np.diff(m["learner"]["update"]) > 0)
    assert len(m["evaluation"]) >= 1
    assert set(m["system"]["rank"]) == set(range(nprocs))


def test_failure_on_one_rank_ends_the_job(mpi, tmp_path):
    t0 = time.monotonic()
    proc = run_main(mpi, 4, tmp_path, "--total-steps", "10000000",
                    env={"PAL_HPC_INJECT_FAULT": "2:1.0"}, timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert elapsed < 60
    out = proc.stdout + proc.stderr
    assert out.count("injected fault on rank 2") == 1 or out.count("rank 2 failed") == 1
    assert "Traceback" in out


@pytest.mark.parametrize("flags, field", [
    (["--batch-size", "0"], "batch_size"),
    (["--env", "NoSuchEnv-v0"], "env"),
    (["--learners-per-node", "3", "--actors-per-node", "3"], "per_node"),
    (["--gamma", "1.5"], "gamma"),
    # Values that passed validation, then crashed every rank or (replay_ratio inf) left
    # the actors stopped for good while the learners spun.
    (["--replay-ratio", "inf"], "replay_ratio"),
    (["--lr", "inf"], "lr"),
    (["--per-eps", "inf"], "per_eps"),
    (["--seed", "99999999999999999999999"], "seed"),
    (["--replay-capacity", "99999999999999999"], "replay_capacity"),
    (["--env", "Pendulum-v1"], "env: dqn needs a Discrete action space; Pendulum-v1 has Box"),
])
def test_bad_config_rejected_before_training(mpi, tmp_path, flags, field):
    proc = run_main(mpi, 4, tmp_path, *flags, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("invalid configuration") == 1
    assert field in proc.stderr
    assert not (tmp_path / "run" / "summary.json").exists()


def test_help_lists_flags_once(mpi, tmp_path):
    proc = mpi(2, "-m", "pal_hpc.main", "--help", timeout=60)
    assert proc.returncode == 0
    for flag in ("--total-steps", "--env", "--ranks-per-node", "--target-return", "--device"):
        assert proc.stdout.count(flag) >= 1
    assert proc.stdout.count("usage:") == 1
