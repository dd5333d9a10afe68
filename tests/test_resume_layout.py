"""Resuming on another allocation, under mpiexec: a checkpoint of DQN (PER, n-step 3)
and of TD3 taken at 2 virtual nodes x 3 ranks resumes on 1 x 2, on 3 x 2 and back on
2 x 3.  The replay holds the saved (transition, priority) multiset, or its newest part
when the new capacity is smaller; parameters, targets and optimizer state equal the
saved ones bit for bit; env steps, updates, episodes and the evaluation schedule carry
over; the same layout continues every rank's RNG stream, another one derives them
reproducibly; and training continues to its target through the real entry point.
Bad input is one clear error that leaves the run directory as it was."""

import json
import shutil

import numpy as np
import pytest

from resume_layout_checks import (LAYOUTS, check_counters, dump, held, newest, replay_parts,
                                  run, run_files, saved_counters, saved_max_priorities,
                                  saved_plain_rows, train_to_checkpoint)

pytestmark = pytest.mark.mpi

# Per node: 2 actors' regions of 400.  The run's 4,000 env steps are job-wide, and on a
# loaded 2-core machine its 4 actors do not share them evenly (one did 65% of the mean):
# a region wraps as long as its actor did 40% of the mean, and the checks below read how
# many rows were saved from the files rather than assuming every region is full.
CAPACITY = 800
FLAGS = {"dqn": ["--algo", "dqn", "--n-step", "3", "--replay-capacity", str(CAPACITY)],
         "td3": ["--algo", "td3", "--env", "Pendulum-v1", "--replay-capacity", str(CAPACITY)]}
STEPS = 4000


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """`checkpoints(algo)`: (algo, run dir, final checkpoint) of a run at 2 x 3, each
    algorithm's made once for the module.  (A module-scoped fixture parametrized by
    algorithm would hold one at a time: the bad-input cases, parametrized on their own,
    made both runs again, 3 min of a 2-core machine.)"""
    made = {}

    def get(algo):
        if algo not in made:
            run_dir = tmp_path_factory.mktemp(algo) / "run"
            made[algo] = algo, run_dir, train_to_checkpoint(run_dir, FLAGS[algo], STEPS)
        return made[algo]
    return get


# TD3's half takes 2.5 min on a loaded 2-core machine: marked slow.
@pytest.fixture(params=["dqn", pytest.param("td3", marks=pytest.mark.slow)])
def saved(request, checkpoints):
    return checkpoints(request.param)


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """`resumed(saved, layout)`: the saved checkpoint resumed on `layout` (`dump`), each
    layout made once per checkpoint: the 3x2 resume the layout test reads is also the
    first of the two that must be identical."""
    made = {}

    def get(saved, layout):
        algo, _, main = saved
        if (algo, layout) not in made:
            made[algo, layout] = dump(tmp_path_factory.mktemp(f"{algo}-{layout}") / "dump",
                                      main, layout, FLAGS[algo])
        return made[algo, layout]
    return get


@pytest.fixture
def dumps(saved, resumed):
    """`dumps(layout)`: `resumed` for this test's checkpoint."""
    return lambda layout: resumed(saved, layout)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_checkpoint_resumes_on_another_layout(saved, dumps, layout):
    algo, _, main = saved
    job = dumps(layout)
    rows = saved_plain_rows(main)
    room = sum(int(n["capacity"]) for n in job["node_files"])
    assert held(job) == newest(rows, room)
    assert CAPACITY < len(rows) <= 2 * CAPACITY and (room < len(rows)) is (layout == "1x2")
    maxima = saved_max_priorities(main)
    for k, node in enumerate(job["node_files"]):
        # Re-split nodes start from the union's max priority; the same layout, its own.
        assert node["max_priority"] == (maxima[k] if layout == "2x3" else max(maxima))
        assert node["total"] == pytest.approx(float(node["prio"].astype(np.float64).sum()),
                                              rel=1e-5)
    counters = saved_counters(main)
    check_counters(job, counters)
    rngs = [r["actor_rng"] for r in job["ranks"]]
    if layout == "2x3":           # the same layout: every rank goes on with its own stream
        assert "resumed from" in job["stdout"] and "resumed 2 nodes" not in job["stdout"]
        assert rngs == [s or None for s in counters["np_rng"]]
    else:
        assert f"-> {'1 node x 2' if layout == '1x2' else '3 nodes x 2'} ranks" in job["stdout"]
        kept = min(room, len(rows))
        note = (f"replay {len(rows):,} -> {kept:,} rows kept: "
                + (f"{len(rows) - kept:,} oldest dropped" if kept < len(rows) else "all of them"))
        assert note in job["stdout"], job["stdout"]
        assert ("oldest dropped" in job["stdout"]) is (layout == "1x2"), job["stdout"]
        assert not set(filter(None, rngs)) & set(counters["np_rng"])


def test_two_resumes_on_one_layout_are_identical(saved, dumps, tmp_path):
    algo, _, main = saved
    a, b = dumps("3x2"), dump(tmp_path / "b", main, "3x2", FLAGS[algo])
    assert [n["state_digest"] for n in a["node_files"]] == \
        [n["state_digest"] for n in b["node_files"]]
    assert a["ranks"] == b["ranks"]          # counters, RNG states, schedule


def test_training_continues_to_its_target_on_fewer_ranks(saved, tmp_path):
    algo, run_dir, main = saved
    counters = saved_counters(main)
    target = counters["env_steps"] + 1500
    proc = run(2, run_dir, *FLAGS[algo], "--ranks-per-node", "2", "--resume", str(main),
               "--total-steps", str(target))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "oldest dropped" in proc.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["params_digest_at_start"] == counters["digest"]
    assert summary["resumed_from"] == str(main) and summary["nodes"] == 1
    assert summary["env_steps"] >= target and summary["updates"] > counters["updates"]
    assert summary["replay_size_at_start"] == CAPACITY and summary["exit_status"] == 0


# One checkpoint per case is enough: DQN's for all but another algorithm (TD3's, slow).
@pytest.mark.parametrize("saved, case", [("dqn", "env"), ("dqn", "no learner"),
                                         ("dqn", "damaged replay part"),
                                         pytest.param("td3", "algo", marks=pytest.mark.slow)],
                         indirect=["saved"])
def test_bad_input_is_one_clear_error_and_changes_nothing(saved, case, tmp_path):
    algo, run_dir, main = saved
    n, flags = 2, [*FLAGS[algo], "--ranks-per-node", "2"]
    expect = f"invalid configuration: {case}: the checkpoint was trained with"
    if case == "env":
        flags += ["--env", "Acrobot-v1"]
    elif case == "algo":
        flags += ["--algo", "ddpg"]
    elif case == "no learner":
        n, flags = 3, [*FLAGS[algo], "--actors-per-node", "3"]
        expect = "invalid configuration: actors_per_node: 1 learner + 3 actors"
    else:
        part = replay_parts(main)[1]
        raw = bytearray(part.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        part.write_bytes(bytes(raw))
        expect = f"invalid configuration: resume: {part}: checksum mismatch"
    before = run_files(run_dir)
    try:
        proc = run(n, run_dir, *flags, "--resume", str(main), "--total-steps", "100000")
    finally:
        if case == "damaged replay part":
            raw[len(raw) // 2] ^= 0xFF
            part.write_bytes(bytes(raw))
            before = {k: v for k, v in before.items() if k != str(part.relative_to(run_dir))}
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("invalid configuration") == 1, proc.stderr
    assert expect in proc.stderr, proc.stderr
    after = {k: v for k, v in run_files(run_dir).items()
             if case != "damaged replay part" or k != str(part.relative_to(run_dir))}
    assert after == before


def test_saved_at_4_ranks_trains_on_at_6_on_3_nodes(tmp_path):
    """The test flags' 20,000-row buffer per node: saved at -n 4 on 2 virtual nodes,
    training goes on at -n 6 on 3 virtual nodes with --resume latest (onto more nodes;
    onto fewer: test_training_continues_to_its_target_on_fewer_ranks and
    test_sync_schedule_resumes_on_another_layout_reproducibly)."""
    run_dir = tmp_path / "run"
    proc = run(4, run_dir, "--ranks-per-node", "2", "--total-steps", "3000")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    digest = json.loads((run_dir / "summary.json").read_text())["params_digest"]
    proc = run(6, run_dir, "--ranks-per-node", "2", "--resume", "latest",
               "--total-steps", "4500")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["params_digest_at_start"] == digest
    assert summary["nodes"] == 3 and summary["env_steps"] >= 4500
    assert "resumed 2 nodes x 2 ranks" in proc.stdout, proc.stdout


def test_sync_schedule_resumes_on_another_layout_reproducibly(tmp_path):
    """--schedule sync: two resumes of one checkpoint on one new layout end with the
    same parameters, bit for bit (the re-split and the derived RNG streams are fixed by
    the checkpoint and the layout)."""
    flags = ["--schedule", "sync", "--round-steps", "40", "--replay-capacity", "1200",
             "--learning-starts", "300"]
    first = tmp_path / "run"
    proc = run(6, first, *flags, "--ranks-per-node", "3", "--total-steps", "2500")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    digests = []
    for name in ("a", "b"):
        run_dir = tmp_path / name
        shutil.copytree(first, run_dir)
        proc = run(2, run_dir, *flags, "--ranks-per-node", "2", "--resume", "latest",
                   "--total-steps", "4000")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "oldest dropped" in proc.stdout, proc.stdout
        digests.append(json.loads((run_dir / "summary.json").read_text())["params_digest"])
    assert digests[0] == digests[1]
