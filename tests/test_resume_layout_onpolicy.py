"""On-policy runs (PAAC, PPO) resume on another layout: a checkpoint of 2 virtual nodes x
2 ranks (two masters, each with an environment worker) continues on 1 node x 2 ranks
(one master) and on 3 nodes x 2 ranks (three).  Each master's algorithm state
(parameters, optimizer, PPO's normalizers and shuffle) equals the checkpoint's to the
bit, the job's counters keep their sums, the evaluation history and schedule carry
over, the new masters' RNG streams are derived anew (docs/logs.md), and training
continues to its target, the same way twice from one checkpoint.  The same layout's
bit-exact resume is checked in test_paac.py, test_ppo.py and test_master_share.py."""

from __future__ import annotations

import json
import shutil
import subprocess

import h5py
import numpy as np
import pytest

from conftest import ROOT, mpi_env, run_mpi
from pal_hpc.cluster.launch import pal_main
from pal_hpc.runtime import stats as S

pytestmark = pytest.mark.mpi

DUMP = ROOT / "tests" / "mpi" / "resume_layout_dump.py"
SAVED_AT = (4, 2)                          # ranks, ranks per node: 2 masters
LAYOUTS = {"1x2": (2, 2), "3x2": (6, 2)}
FLAGS = {"ppo": ["--algo", "ppo", "--hidden", "16", "--num-steps", "32"],
         "paac": ["--algo", "paac", "--hidden", "32", "32"]}
COMMON = ["--num-envs", "4", "--eval-episodes", "2", "--progress-every", "0.5"]
SAVED_STEPS = 1500


def launch(n, run_dir, algo, *flags, timeout=180):
    return subprocess.run(pal_main(n, *FLAGS[algo], *COMMON, "--run-dir", str(run_dir), *flags),
                          cwd=ROOT, env=mpi_env(), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module", params=list(FLAGS))
def saved(request, tmp_path_factory):
    """A run at SAVED_AT to its final checkpoint (copied out of its run dir), and what
    the file says: attributes and each old master's saved counters and RNG."""
    algo = request.param
    tmp = tmp_path_factory.mktemp(f"saved-{algo}")
    n, k = SAVED_AT
    proc = launch(n, tmp / "run", algo, "--ranks-per-node", str(k), "--total-steps",
                  str(SAVED_STEPS), "--eval-every", "600")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = json.loads((tmp / "run" / "summary.json").read_text())
    path = tmp / "saved.h5"
    shutil.copy(first["checkpoint"], path)
    with h5py.File(path, "r") as f:
        info = {"algo": algo, "path": path, "summary": first,
                "attrs": {k: f.attrs[k] for k in ("updates", "env_steps", "global_steps",
                                                  "params_digest")},
                "evals": json.loads(f.attrs["evals"]), "layout": json.loads(f.attrs["layout"]),
                "ranks": {name: {"stats": json.loads(g.attrs["stats"]),
                                 "np_rng": json.loads(g.attrs["np_rng"]),
                                 "next_eval": float(g.attrs["next_eval"])}
                          for name, g in f["ranks"].items()}}
    assert info["layout"] == [2, 2] and sorted(info["ranks"]) == ["rank_0", "rank_2"]
    assert info["evals"], "the saved run evaluated (its history must carry over)"
    return info


def dump(saved, layout, tmp_path) -> dict:
    n, k = LAYOUTS[layout]
    out = tmp_path / layout
    out.mkdir()
    proc = run_mpi(n, DUMP, str(out), *FLAGS[saved["algo"]], *COMMON, "--run-dir",
                   str(out / "run"), "--resume", str(saved["path"]),
                   "--ranks-per-node", str(k), timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = json.loads((out / "job.json").read_text())
    job["stdout"] = proc.stdout
    return job


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_an_on_policy_checkpoint_resumes_on_another_layout(saved, layout, tmp_path):
    job = dump(saved, layout, tmp_path)
    nodes = LAYOUTS[layout][0] // LAYOUTS[layout][1]
    masters = [r for r in job["ranks"] if r["master"]]
    assert job["nodes"] == nodes and len(masters) == nodes
    assert [m["rank"] for m in masters] == list(range(0, LAYOUTS[layout][0], 2))
    # The algorithm's whole state, bit for bit, on every master.
    assert all(m["algo_state_equal"] for m in masters)
    assert {m["digest"] for m in masters} == {saved["attrs"]["params_digest"]}
    # The job's counters keep their sums; the env steps are dealt out evenly.
    old = np.sum([r["stats"][:S.SIZE] for r in saved["ranks"].values()], axis=0)
    new = np.sum([m["stats"] for m in masters], axis=0)
    for slot in (S.ENV_STEPS, S.EPISODES, S.UPDATES, S.RETURN_SUM, S.RETURN_COUNT):
        assert new[slot] == old[slot], slot
    assert new[S.ENV_STEPS] == saved["attrs"]["env_steps"] > 0
    assert new[S.UPDATES] == saved["attrs"]["updates"] > 0
    assert new[S.EPISODES] == saved["summary"]["episodes"] > 0
    steps = [m["node_steps"] for m in masters]
    assert steps == [m["stats"][S.ENV_STEPS] for m in masters]
    assert max(steps) - min(steps) <= 1
    # The evaluation history and schedule are the old rank 0's.
    for m in masters:
        assert m["evals"] == saved["evals"]
        assert m["global_base"] == saved["attrs"]["global_steps"]
    assert masters[0]["next_eval"] == saved["ranks"]["rank_0"]["next_eval"]
    # No old master is a new one: every stream is new, and each master's its own.
    old_rngs = [json.dumps(r["np_rng"]) for r in saved["ranks"].values()]
    new_rngs = [json.dumps(json.loads(m["rng"])) for m in masters]
    assert len(set(new_rngs)) == nodes and not set(new_rngs) & set(old_rngs)
    assert len({m["torch_rng"] for m in masters}) == nodes
    # The start-up line says what changed.
    before = "2 nodes x 2 ranks (2 masters, 4 + 4 envs)"
    after = ("1 node x 2 ranks (1 master, 4 envs)" if nodes == 1 else
             "3 nodes x 2 ranks (3 masters, 4 + 4 + 4 envs)")
    assert f"{before} -> {after}" in job["stdout"], job["stdout"]


def test_training_continues_on_one_master_the_same_way_twice(saved, tmp_path):
    target = SAVED_STEPS + 1500
    ends = []
    for k in range(2):
        run_dir = tmp_path / f"again{k}"
        proc = launch(2, run_dir, saved["algo"], "--resume", str(saved["path"]),
                      "--total-steps", str(target), "--eval-every", "600")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        s = json.loads((run_dir / "summary.json").read_text())
        assert s["resumed_from"] == str(saved["path"]) and s["nodes"] == 1
        assert s["params_digest_at_start"] == saved["attrs"]["params_digest"]
        assert s["env_steps"] >= target and s["updates"] > saved["attrs"]["updates"]
        assert s["episodes"] > saved["summary"]["episodes"]
        assert s["exit_status"] == 0 and s["stop_reason"] == f"{target} env steps done"
        with h5py.File(s["checkpoint"], "r") as f:
            evals = json.loads(f.attrs["evals"])
            ends.append(f.attrs["params_digest"])
        # The old evaluations, then the new ones on the old schedule.
        assert evals[:len(saved["evals"])] == saved["evals"]
        assert len(evals) > len(saved["evals"])
        assert all(e["env_steps"] > saved["attrs"]["global_steps"]
                   for e in evals[len(saved["evals"]):])
    assert ends[0] == ends[1]
