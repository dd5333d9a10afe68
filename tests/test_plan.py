"""The planner: the performance model (pure, no measurement), "auto" in the config and the
topology, `python -m pal_hpc.plan` end to end, and a run planned at start-up under mpiexec."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from pal_hpc.cluster.topology import assign_roles, node_counts
from pal_hpc.config import Config, ConfigError
from pal_hpc.config_io import build_parser, config_from_dict, load_config
from pal_hpc.plan import (TIE, Layout, Prediction, Rates, all_splits, candidate_learners,
                          default_split, fair_share, layout_from_table, make_plan,
                          others_from_share,
                          predict, recommend, split_from_checkpoint, sync_time)
from pal_hpc.plan.model import gang_time, update_time

from conftest import ROOT, mpi_env, pal_cmd

B, RATIO = 64, 32.0                 # batch and replay ratio: k = L * 2 env steps per update


def one_node(ranks, cores, others=0.0):
    return Layout.one_host(ranks, cores, others=others)


def close(x, y, rel=1e-6):
    return math.isclose(x, y, rel_tol=rel)


# -- the model ------------------------------------------------------------------------

def test_split_batch_shortens_the_update_and_shares_the_samples():
    # u(rows) = 1 ms at 64 rows, 0.6 ms at 32 (the fixed part does not split): with the
    # split batch 2 learners take 0.6 ms + r per update and, at the same replay ratio,
    # sample 64 rows per update between them (k = 2 env steps per update, not 4).
    rates = Rates(actor_step_s=1e-5, update_s=1e-3, sync_s=((2, 1e-4),),
                  update_by_rows=((32, 6e-4), (64, 1e-3)))
    assert close(update_time(rates, 48), 8e-4) and close(update_time(rates, 16), 6e-4)
    one = predict(one_node(4, 8), (1,), rates, B, RATIO, split=True)
    two = predict(one_node(4, 8), (2,), rates, B, RATIO, split=True)
    assert close(one.updates_per_s, 1000) and close(two.updates_per_s, 1 / 7e-4)
    assert close(two.env_steps_per_s, 2 * two.updates_per_s)
    full = predict(one_node(4, 8), (2,), rates, B, RATIO)          # the old behaviour
    assert close(full.updates_per_s, 1 / 1.1e-3) and close(full.env_steps_per_s,
                                                             4 * full.updates_per_s)
    plan = make_plan(one_node(4, 8), rates, B, RATIO, split=True)
    assert plan["inputs"]["learner_batch"] == "split" and plan["learners"] >= 2


def test_learners_bound_on_free_cores():
    rates = Rates(actor_step_s=1e-5, update_s=1e-3)
    p = predict(one_node(4, 8), (1,), rates, B, RATIO)
    assert p.bottleneck == "learners"
    assert close(p.updates_per_s, 1000) and close(p.env_steps_per_s, 2000)
    assert p.actors == (3,) and p.gradient_batches_per_s == p.updates_per_s
    # Two learners without an Allreduce cost would double it; with r = 1 ms per phase
    # (2 phases per update) each update takes u + 2 r = 3 ms.
    assert close(predict(one_node(4, 8), (2,), rates, B, RATIO).env_steps_per_s, 4000)
    slow = dataclasses.replace(rates, phases_per_update=2.0, sync_s=((2, 1e-3),))
    p2 = predict(one_node(4, 8), (2,), slow, B, RATIO)
    assert close(p2.updates_per_s, 1 / 3e-3) and close(p2.gradient_batches_per_s, 2 / 3e-3)
    assert close(p2.env_steps_per_s, 4 / 3e-3)


def test_actors_bound_on_free_cores():
    rates = Rates(actor_step_s=1e-3, update_s=1e-5)
    p = predict(one_node(4, 8), (1,), rates, B, RATIO)
    assert p.bottleneck == "actors"
    assert close(p.env_steps_per_s, 3 / 1e-3)            # A / a
    assert close(p.updates_per_s, 3 / 1e-3 / 2)          # S / k


def test_ranks_beyond_cores_share_them():
    # 8 ranks, 2 cores, every rank busy: total CPU = C, S = C / (a + ratio u / batch).
    rates = Rates(actor_step_s=2e-4, update_s=4e-4)
    for learners in (2, 4, 6):
        p = predict(one_node(8, 2), (learners,), rates, B, RATIO)
        assert p.bottleneck == "cores"
        assert close(p.env_steps_per_s, 2 / (2e-4 + RATIO * 4e-4 / B)), learners
        assert p.unlimited_env_steps_per_s > p.env_steps_per_s
    # The same ranks on 8 cores are not limited by them.
    assert predict(one_node(8, 8), (4,), rates, B, RATIO).bottleneck != "cores"


def test_one_node_is_the_closed_form():
    """With no other programs and no Allreduce cost the fair-share model is exactly
    S = min(A / a, L batch / (ratio u), C / (a + ratio u / batch))."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        ranks = int(rng.integers(2, 17))
        learners = int(rng.integers(1, ranks))
        actors = ranks - learners
        cores = float(rng.integers(1, 17))
        a, u = 10 ** rng.uniform(-6, -3), 10 ** rng.uniform(-5, -1)
        batch, ratio = int(rng.integers(16, 512)), float(10 ** rng.uniform(-0.5, 2.5))
        want = min(actors / a, learners * batch / (ratio * u), cores / (a + ratio * u / batch))
        p = predict(one_node(ranks, cores), (learners,), Rates(a, u), batch, ratio)
        assert close(p.env_steps_per_s, want, rel=1e-6), (ranks, learners, cores, a, u)


def test_solo_node_acts_and_learns_on_one_core():
    rates = Rates(actor_step_s=1e-4, update_s=1e-3)
    p = predict(one_node(1, 4), (1,), rates, B, RATIO)
    assert p.learners == p.actors == (1,)
    assert close(p.updates_per_s, 1 / (2 * 1e-4 + 1e-3)) and p.bottleneck == "learners"
    p = predict(one_node(1, 4), (1,), Rates(actor_step_s=1e-3, update_s=1e-4), B, RATIO)
    assert p.bottleneck == "actors"


def test_virtual_nodes_share_their_host_and_the_allreduce():
    rates = Rates(actor_step_s=1e-5, update_s=1e-3, sync_s=((2, 1e-3),))
    two = Layout((2, 2), (0, 0), (8.0,))
    p = predict(two, (1, 1), rates, B, RATIO)
    # Two learners (one per node) in one Allreduce; each node's actor keeps up.
    assert close(p.updates_per_s, 1 / 2e-3) and close(p.env_steps_per_s, 2 * 2 / 2e-3)
    # On one core the host's four ranks share it.
    p1 = predict(Layout((2, 2), (0, 0), (1.0,)), (1, 1), rates, B, RATIO)
    assert p1.bottleneck == "cores" and p1.env_steps_per_s < p.env_steps_per_s
    # On two hosts of one core each, each host has one busy learner: not limited.
    p2 = predict(Layout((2, 2), (0, 1), (1.0, 1.0)), (1, 1), rates, B, RATIO)
    assert p2.bottleneck == "learners" and close(p2.env_steps_per_s, p.env_steps_per_s)


def test_other_programs_take_their_share():
    rates = Rates(actor_step_s=1e-7, update_s=1e-3)
    free = predict(one_node(2, 2), (1,), rates, B, RATIO)
    busy = predict(one_node(2, 2, others=2.0), (1,), rates, B, RATIO)
    # One busy learner beside 2 busy processes on 2 cores: about 2/3 of a core.
    assert busy.bottleneck == "cores"
    assert close(busy.updates_per_s / free.updates_per_s, 2 / 3, rel=1e-3)
    assert close(busy.unlimited_env_steps_per_s, free.env_steps_per_s)
    # Sleeping ranks that wake every millisecond add to the crowd.
    woke = predict(one_node(2, 2, others=2.0), (1,),
                   dataclasses.replace(rates, idle_cpu=0.05), B, RATIO)
    assert woke.env_steps_per_s < busy.env_steps_per_s
    assert others_from_share(2, 0.4) == pytest.approx(4.0)
    assert others_from_share(2, 1.0) == 0.0 and others_from_share(16, 0.97) == 0.0


def test_fair_share_of_a_core():
    assert fair_share([(0.3, 2)], cores=2) == 1.0                  # room for everyone
    assert close(fair_share([(1.0, 3)], cores=2), 2 / 3)           # 3 busy on 2 cores
    assert close(fair_share([(5.0, 1)], cores=2, others=2), 2 / 3)
    # A rank that needs 0.1 core takes it; the 3 busy ones share the rest.
    assert close(fair_share([(1.0, 3), (0.1, 1)], cores=2), 1.9 / 3)
    # Sleeping ranks' wake-ups count: 10 idle ranks at 5% are half a busy process.
    assert close(fair_share([(1.0, 2), (0.0, 10)], cores=2, idle_cpu=0.05), 2 / 2.5)


def test_sync_time_interpolates_in_log2():
    pts = ((2, 1.0), (4, 3.0))
    assert sync_time(pts, 1) == 0.0 and sync_time((), 8) == 0.0
    assert sync_time(pts, 2) == 1.0 and sync_time(pts, 4) == 3.0
    assert close(sync_time(pts, 3), 1.0 + 2.0 * (math.log2(3) - 1))
    assert close(sync_time(pts, 8), 3.0 * 3 / 2)             # beyond: in proportion to log2


def test_gang_time_is_a_floor_under_the_learners_update():
    """TD3-like rates on 2 cores: u(128) = 7 ms, u(86) = 5.5 ms; measured g: 2 learners
    10 ms per update, 3 learners 16.5 ms (two compute, then the third).  Fair shares
    alone would pick 3 learners; the floor picks 2."""
    rates = Rates(actor_step_s=6e-5, update_s=12e-3, phases_per_update=1.5,
                  sync_s=((2, 1.4e-3), (3, 1.8e-3)),
                  update_by_rows=((32, 4e-3), (64, 4.5e-3), (128, 7e-3), (256, 12e-3)))
    gang = dataclasses.replace(rates, gang_s=((2, 10e-3), (3, 16.5e-3)))
    assert gang_time(gang, 1) == 0.0 and gang_time(rates, 3) == 0.0
    assert close(gang_time(gang, 3), 16.5e-3) and close(gang_time(gang, 8), 16.5e-3)
    assert close(gang_time(dataclasses.replace(gang, gang_s=((2, 1.0), (4, 3.0))), 3), 2.0)
    layout = one_node(4, 2)
    without = [predict(layout, (n,), rates, 256, 256.0, split=True) for n in (1, 2, 3)]
    floored = [predict(layout, (n,), gang, 256, 256.0, split=True) for n in (1, 2, 3)]
    assert close(floored[0].updates_per_s, without[0].updates_per_s)   # 1 learner: no floor
    assert floored[2].updates_per_s <= 1 / 16.5e-3 * (1 + 1e-6)
    assert floored[1].updates_per_s <= 1 / 10e-3 * (1 + 1e-6)
    assert recommend(without).total_learners == 3
    assert recommend(floored).total_learners == 2
    plan = make_plan(layout, gang, 256, 256.0, split=True)
    assert plan["split"] == {"4": [2, 2]} and plan["inputs"]["gang_s"] == {"2": 10e-3,
                                                                           "3": 16.5e-3}


def test_bad_splits_are_refused():
    rates = Rates(1e-5, 1e-3)
    for learners in ((0,), (4,), (1, 1)):
        with pytest.raises(ValueError):
            predict(one_node(4, 2), learners, rates, B, RATIO)
    with pytest.raises(ValueError, match="positive"):
        predict(one_node(4, 2), (1,), Rates(0.0, 1e-3), B, RATIO)


# -- choosing ---------------------------------------------------------------------------

def pred(learners, updates, s, unlimited):
    return Prediction((learners,), (8 - learners,), s, updates, updates * learners, "cores",
                      unlimited)


def test_recommend_takes_the_most_updates_then_breaks_ties():
    # Most optimizer steps per second wins, even against more env steps/s...
    assert recommend([pred(1, 100, 100, 100), pred(2, 60, 200, 200)]).learners == (1,)
    assert recommend([pred(1, 50, 100, 100), pred(2, 80, 200, 200)]).learners == (2,)
    # ...within TIE of the most updates/s: the most env steps/s, then the most with
    # free cores...
    near = 100 * (1 - TIE / 2)
    assert recommend([pred(1, 100, 200, 300), pred(2, near, 250, 900)]).learners == (2,)
    assert recommend([pred(1, 100, 200, 300), pred(2, near, 200, 900),
                      pred(3, 50, 400, 5000)]).learners == (2,)
    # ...then fewer learners.
    assert recommend([pred(3, 100, 200, 900), pred(2, 100, 200, 900)]).learners == (2,)
    with pytest.raises(ValueError):
        recommend([])


def test_recommendation_on_a_realistic_machine():
    """CartPole-like rates on 2 cores: a 2nd learner's Allreduce slows every update
    down, so 1 learner + 3 actors has the most updates/s."""
    rates = Rates(actor_step_s=4e-5, update_s=1.2e-3, sync_s=((2, 0.6e-3), (3, 1.1e-3)))
    plan = make_plan(one_node(4, 2), rates, B, RATIO)
    assert plan["split"] == {"4": [1, 3]} and plan["bottleneck"] == "learners"
    assert plan["default"]["split"] == {"4": [1, 3]}
    assert [row["learners"] for row in plan["table"]] == [1, 2, 3]
    one, two, three = plan["table"]
    assert one["updates_per_s"] > two["updates_per_s"] > three["updates_per_s"]
    assert three["env_steps_per_s"] > one["env_steps_per_s"]     # more env steps, fewer updates
    assert json.loads(json.dumps(plan)) == plan
    # A fixed count leaves one candidate; a split from a checkpoint is kept.
    assert make_plan(one_node(4, 2), rates, B, RATIO, learners_per_node=2)["split"] == {
        "4": [2, 2]}
    assert make_plan(one_node(4, 2), rates, B, RATIO, forced=(3,))["split"] == {"4": [3, 1]}


def test_actors_are_added_while_they_are_the_bottleneck():
    """Expensive environments (Atari-like) on 8 free cores: actors limit, so the most
    updates/s needs 1 learner and the rest actors."""
    rates = Rates(actor_step_s=2e-3, update_s=1e-3)
    plan = make_plan(one_node(8, 8), rates, B, RATIO)
    assert plan["split"] == {"8": [1, 7]}


def test_candidate_splits():
    assert candidate_learners(1, "auto", "auto") == [1]
    assert candidate_learners(5, "auto", "auto") == [1, 2, 3, 4]
    assert candidate_learners(5, "auto", 0) == [1, 2, 3, 4]
    assert candidate_learners(8, "auto", 0.25) == [2]
    assert candidate_learners(8, 3, "auto") == [5]
    with pytest.raises(ConfigError, match="^learners_per_node: 4.0 leaves no valid split"):
        candidate_learners(4, "auto", 4.0)
    with pytest.raises(ConfigError, match="^actors_per_node: "):
        candidate_learners(4, 4.0, "auto")
    # Nodes of one size share a split; a 1-rank node is solo.
    assert all_splits(Layout((4, 4), (0, 0), (2.0,))) == [(1, 1), (2, 2), (3, 3)]
    assert all_splits(Layout((2, 1), (0, 0), (2.0,))) == [(1, 1)]
    assert len(all_splits(Layout((4, 3), (0, 0), (2.0,)))) == 3 * 2
    assert default_split(Layout((8, 3, 1), (0, 0, 0), (2.0,))) == (2, 1, 1)


def test_layout_from_the_gathered_table():
    # 6 ranks on one 2-core host, virtual nodes of 4 + 2.
    layout, order = layout_from_table([(0, r, 2) for r in range(6)], ranks_per_node=4)
    assert layout == Layout((4, 2), (0, 0), (2.0,))
    assert order[:2] == [0, 4]                 # the first learner of each node first
    assert sorted(order) == list(range(6))
    # Two hosts (leaders 0 and 2), interleaved ranks, real nodes.
    table = [(0, 0, 8), (0, 1, 8), (2, 0, 4), (2, 1, 4)]
    layout, order = layout_from_table(table)
    assert layout == Layout((2, 2), (0, 1), (8.0, 4.0)) and order == [0, 2, 1, 3]


# -- "auto" in the configuration and the topology ----------------------------------------

def test_auto_is_accepted_everywhere(tmp_path):
    cfg = load_config(["--actors-per-node", "auto", "--learners-per-node", "auto"])
    assert (cfg.actors_per_node, cfg.learners_per_node) == ("auto", "auto")
    toml = tmp_path / "c.toml"
    toml.write_text('learners-per-node = "auto"\nactors_per_node = 0\n')
    assert load_config(["--config", str(toml)]).learners_per_node == "auto"
    js = tmp_path / "c.json"
    js.write_text(json.dumps({"actors_per_node": "auto", "learners_per_node": 2}))
    cfg = load_config(["--config", str(js)])
    assert (cfg.actors_per_node, cfg.learners_per_node) == ("auto", 2.0)
    assert config_from_dict({"learners_per_node": "auto"}).learners_per_node == "auto"
    assert load_config([]).actors_per_node == 0.0           # the default is unchanged
    text = " ".join(build_parser().format_help().split())
    assert "--actors-per-node X|auto" in text and "auto = the planner's choice" in text


@pytest.mark.parametrize("args, pattern", [
    (["--actors-per-node", "Auto"], r"^actors_per_node: must be auto, 0 \(the default "
                                    r"split\), a fraction in \(0, 1\) or an integer >= 1, "
                                    r"got 'Auto'$"),
    (["--learners-per-node", "most"], r"^learners_per_node: must be auto, .* got 'most'$"),
    (["--learners-per-node", "inf"], r"^learners_per_node: must be auto, .* got inf$"),
    (["--algo", "paac", "--learners-per-node", "auto"],
     r"^learners_per_node: --algo paac runs one master per node .* auto plans actors and "
     r"learners for the off-policy algorithms\), got 'auto'$"),
    # Found by the flags, not once the on-policy runtime has started (after torch).
    (["--algo", "ppo", "--actors-per-node", "1"],
     r"^actors_per_node: --algo ppo runs one master per node and makes the other ranks "
     r"environment workers \(leave it 0; .*\), got 1.0$"),
])
def test_bad_per_node_values_name_the_field(args, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(args)


def test_wrong_types_in_a_file_name_the_field():
    with pytest.raises(ConfigError, match=r'^actors_per_node: expected a number or "auto", '
                                          r"got True \(bool\)"):
        config_from_dict({"actors_per_node": True})
    with pytest.raises(ConfigError, match="^learners_per_node: expected a number"):
        config_from_dict({"learners_per_node": [1]})
    with pytest.raises(ConfigError, match="^actors_per_node: must be auto"):
        Config(actors_per_node="").validate()


def test_roles_follow_the_planners_split():
    roles = assign_roles(7, [4, 2, 1], "auto", "auto", split={4: (2, 2), 2: (1, 1)})
    assert "".join("S" if r.is_solo else "L" if r.is_learner else "A" for r in roles) == \
        "LLAALAS"
    assert node_counts(0, 4, "auto", 0, split={4: (3, 1)}) == (3, 1)
    with pytest.raises(ValueError, match="no entry for that size"):
        node_counts(0, 4, "auto", "auto")
    with pytest.raises(ValueError, match="planner's split gives"):
        node_counts(0, 4, "auto", "auto", split={4: (4, 0)})


def test_a_resumed_run_keeps_its_checkpoints_split(tmp_path):
    import h5py

    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    layout = [[0, 0, 1], [0, 0, 1], [0, 1, 0], [0, 1, 0], [1, 0, 1], [1, 1, 0]]
    with h5py.File(ckpts / "step_0000000100.h5", "w") as f:
        f.attrs["layout"] = json.dumps(layout)
    (ckpts / "step_0000000200.h5").write_bytes(b"not hdf5")          # skipped
    cfg = Config(run_dir=str(tmp_path / "run"), resume="latest")
    here = Layout((4, 2), (0, 0), (2.0,))
    assert split_from_checkpoint(cfg, here) == ((2, 1), str(ckpts / "step_0000000100.h5"))
    assert split_from_checkpoint(cfg, Layout((3, 3), (0, 0), (2.0,))) is None
    assert split_from_checkpoint(Config(run_dir=str(tmp_path / "none"), resume="auto"),
                                 here) is None


# -- end to end ------------------------------------------------------------------------

FAST = ["--hidden", "32", "32", "--budget", "0.6"]


def plan_cli(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "pal_hpc.plan", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=mpi_env())


def test_plan_cli_prints_every_split_and_the_recommendation():
    out = plan_cli("--ranks", "4", *FAST)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    rows = [line for line in lines if line.startswith(("1 learner", "2 learners", "3 learners"))]
    assert len(rows) == 3, out.stdout
    assert sum("<- recommended" in row for row in rows) == 1
    assert "(default split)" in rows[0]
    assert "a = actor per env step" in out.stdout and "u = learner update" in out.stdout
    assert "2 learners" in out.stdout.split("r = Allreduce per phase")[1].splitlines()[0]
    assert "3 learners" in out.stdout.split("g = update of L learners")[1].splitlines()[0]
    assert any(line.startswith("recommended: ") for line in lines)


def test_plan_cli_json_and_errors():
    out = plan_cli("--ranks", "4", "--ranks-per-node", "2", "--json", "--others", "0", *FAST)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["inputs"]["node_sizes"] == [2, 2] and plan["split"] == {"2": [1, 1]}
    assert plan["inputs"]["host_others"] == [0.0]
    assert plan["env_steps_per_s"] > 0 and plan["bottleneck"] in ("learners", "actors", "cores")
    assert set(plan["inputs"]["sync_s"]) == {"2"}
    bad = plan_cli("--ranks", "4", "--algo", "paac", *FAST)
    assert bad.returncode == 2 and "paac" in bad.stderr and "Traceback" not in bad.stderr
    bad = plan_cli("--ranks", "4", "--learners-per-node", "4", *FAST)
    assert bad.returncode == 2
    assert "learners_per_node: 4.0 leaves no valid split" in bad.stderr
    helped = plan_cli("--help")
    assert helped.returncode == 0 and "planner:" in helped.stdout
    assert "--ranks N" in helped.stdout and "--actors-per-node X|auto" in helped.stdout


@pytest.mark.mpi
def test_the_gang_probe_times_learners_updating_together():
    """Two ranks each take TD3's real update on 128 rows (critic, then critic and
    actor) and reduce every phase: an update takes the reduction's time plus at least
    a quarter of the CPU time one update takes alone (measured here with the same
    stand-in, on one torch thread as the ranks run; the two measurements are in
    different processes, so only a wide margin is safe from noise -- CI once saw the
    gang at 0.76x the lone update), and no gang without rows.  A probe that only
    reduced would come out at the reduction's time."""
    import time

    from pal_hpc.plan.measure import UpdateStandIn
    from pal_hpc.plan.probe import measure_sync_here

    argv = ["--algo", "td3", "--env", "Pendulum-v1", "--hidden", "64", "64"]
    stand = UpdateStandIn(load_config(argv), 128)
    assert stand.period == 2 and [len(p) for p in stand.phase_lists[:2]] == [1, 2]
    cpu = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)     # process_time sums every thread's CPU time
    try:
        for _ in range(5):
            c0 = time.process_time()
            for i in range(2):
                for phase in stand.phase_lists[i]:
                    n = stand.gradient(phase)
                    stand.recv[:n] = stand.send[:n]
                    stand.apply(phase, n, 1.0)
            cpu.append((time.process_time() - c0) / 2)
    finally:
        torch.set_num_threads(threads)
    sync, gang = measure_sync_here([2], stand.send.size - 3, argv, {2: 128})
    assert set(sync) == set(gang) == {2}
    assert sync[2] > 0 and gang[2] - sync[2] >= 0.25 * min(cpu), (sync, gang, cpu)
    assert measure_sync_here([2], 1000)[1] == {}             # no rows given: no gang


@pytest.mark.mpi
def test_a_run_planned_at_start_up_records_the_plan(tmp_path):
    run_dir = tmp_path / "run"
    cmd = pal_cmd(3, run_dir, "--actors-per-node", "auto", "--learners-per-node", "auto",
                  "--total-steps", "2000")
    proc = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pal_hpc: plan: " in proc.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    plan = summary["plan"]
    (learners, actors), = plan["split"].values()
    assert plan["split"] == {"3": [learners, actors]} and learners + actors == 3
    assert (summary["learners"], summary["actors"]) == (learners, actors)
    assert plan["env_steps_per_s"] > 0 and plan["updates_per_s"] > 0
    assert plan["source"] == "measured" and plan["inputs"]["node_sizes"] == [3]
    assert set(plan["inputs"]["sync_s"]) == {"2"}            # 2 learners was a candidate
    assert set(plan["inputs"]["gang_s"]) == {"2"}
    assert len(plan["table"]) == 2
    assert plan["measured"]["env_steps_per_s"] == pytest.approx(
        summary["env_steps"] / summary["wall_s"])
    assert set(plan["relative_error"]) == set(plan["measured"])
    config = json.loads((run_dir / "config.json").read_text())
    assert config["actors_per_node"] == config["learners_per_node"] == "auto"
