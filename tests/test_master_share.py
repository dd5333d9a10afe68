"""The master's share: LockstepVectorEnv(master_envs=m) steps envs [0, m) in the caller
while the workers step the rest, and PAAC's --master-envs does the same on each node's
master.  Which process steps an env must change nothing: every result is compared bit
for bit with the run that has no share."""

import json
import os
import subprocess
from contextlib import closing

import gymnasium as gym
import h5py
import numpy as np
import pytest

from conftest import ROOT, mpi_env
from pal_hpc.cluster.launch import pal_main
from pal_hpc.config import ConfigError
from pal_hpc.envs.lockstep import LockstepError, LockstepVectorEnv
from pal_hpc.io.metrics import read_run_metrics
from pal_hpc.runtime.onpolicy.layout import MASTER_ALONE_BELOW_S, auto_share, node_layout


def _make():
    return gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))


class _Boom(gym.Wrapper):
    def step(self, action):
        raise ValueError("boom in env 1")


def _boom():
    return _Boom(gym.make("CartPole-v1"))


@pytest.mark.parametrize("workers,share", [(1, 1), (1, 4), (2, 1), (2, 3), (0, 0)])
def test_a_share_steps_exactly_as_sync_vector_env(workers, share):
    fns = [_make] * 5
    with LockstepVectorEnv(fns, workers, master_envs=share) as ours, \
            closing(gym.vector.SyncVectorEnv(fns)) as ref:
        assert ours.master_envs == (share if workers else 5)
        assert [lo for lo, _ in ours._views.layout.ranges()][:1] == ([share] if workers else [])
        o1, _ = ours.reset(seed=3)
        o2, _ = ref.reset(seed=3)
        assert np.array_equal(o1, o2)
        space = ref.action_space
        space.seed(1)
        ends = 0
        for t in range(300):
            a = space.sample()
            r1, r2 = ours.step(a), ref.step(a)
            for x, y in zip(r1[:4], r2[:4]):
                assert x.dtype == y.dtype and np.array_equal(x, y), t
            assert np.array_equal(r1[4].get("_episode", False), r2[4].get("_episode", False))
            if "episode" in r2[4]:
                assert np.array_equal(r1[4]["episode"]["r"], r2[4]["episode"]["r"])
            ends += int(r1[2].sum() + r1[3].sum())
            if t == 150:                       # a partial reset reaches share and workers
                mask = np.array([True, False, True, False, True])
                o1, _ = ours.reset(seed=9, options={"reset_mask": mask})
                o2, _ = ref.reset(seed=9, options={"reset_mask": mask.copy()})
                assert np.array_equal(o1, o2)
        assert ends >= 5                       # autoreset ran in every part
        assert ours.get_attr("np_random_seed") == ref.get_attr("np_random_seed")
        ours.set_attr("marker", [10, 11, 12, 13, 14])
        assert ours.get_attr("marker") == (10, 11, 12, 13, 14)


def test_the_share_steps_between_step_async_and_step_wait():
    with LockstepVectorEnv([_make] * 4, 2, master_envs=2) as env:
        env.reset(seed=0)
        env.step_async(np.zeros(4, np.int64))
        obs, *_ = env.step_wait()
        assert obs.shape == (4, 4)
        with pytest.raises(Exception, match="without any prior call"):
            env.step_wait()


def test_an_error_in_the_share_names_the_master_and_closes_the_workers():
    env = LockstepVectorEnv([_make, _boom, _make, _make], 2, master_envs=2)
    pids = env.worker_pids
    env.reset(seed=0)
    with pytest.raises(ValueError, match="boom in env 1") as info:
        env.step(np.zeros(4, np.int64))
    assert isinstance(info.value, LockstepError)
    assert "master (its own envs 0..1)" in str(info.value)
    assert env.closed
    for pid in pids:                           # every worker stopped
        with pytest.raises(ProcessLookupError):
            import os
            os.kill(pid, 0)


@pytest.mark.parametrize("workers,share,match", [
    (1, 5, "master_envs: 5 of 5 environments leaves 0 for 1 workers"),
    (2, 4, "master_envs: 4 of 5 environments leaves 1 for 2 workers"),
    (1, 6, r"master_envs: 6; expected an int in \[0, 5\]"),
    (1, -1, r"master_envs: -1; expected an int in \[0, 5\]"),
    (1, True, r"master_envs: True; expected an int"),
])
def test_a_share_that_leaves_a_worker_nothing_is_refused(workers, share, match):
    with pytest.raises(ValueError, match=match):
        LockstepVectorEnv([_make] * 5, workers, master_envs=share)


def test_a_share_of_every_env_with_default_workers_steps_all_in_the_caller():
    with LockstepVectorEnv([_make] * 3, master_envs=3) as env:
        assert env.num_workers == 0 and env.master_envs == 3
        env.reset(seed=0)
        env.step(np.zeros(3, np.int64))


# ---- the layout rule -------------------------------------------------------------------

def test_node_layout():
    assert node_layout(0, 0, 3) == (33, 0)            # unchanged without a share
    assert node_layout(8, 0.0, 2) == (8, 0)
    assert node_layout(8, 4.0, 2) == (8, 4)
    assert node_layout(0, 8.0, 3) == (32, 8)          # 32: the workers share 24
    assert node_layout(0, 5.0, 3) == (32, 5)
    assert node_layout(0, "auto", 1) == (32, 16)
    assert node_layout(0, "auto", 3) == (32, auto_share(32, 3))
    assert node_layout(9, "auto", 0) == (9, 9)        # one rank: the master steps all
    assert node_layout(9, 3.0, 0) == (9, 9)
    assert node_layout(0, "auto", 3, crowded=True) == (33, 0)   # as with no share
    assert node_layout(0, "auto", 1, crowded=True) == (32, 0)
    assert node_layout(8, 4.0, 2, crowded=True) == (8, 4)       # a number is kept
    assert node_layout(9, "auto", 3, crowded=True) == (9, 0)
    assert node_layout(8, "auto", 3, crowded=True) == (8, 2)    # the least even share
    # all: the master steps every env, whatever the workers; auto too when a step of
    # them all costs it under MASTER_ALONE_BELOW_S.
    assert node_layout(0, "all", 3) == (32, 32)
    assert node_layout(8, "all", 3) == (8, 8)
    cheap = MASTER_ALONE_BELOW_S / 32 * 0.99
    assert node_layout(0, "auto", 3, step_s=cheap) == (32, 32)
    assert node_layout(0, "auto", 3, crowded=True, step_s=cheap) == (32, 32)
    assert node_layout(8, "auto", 3, step_s=MASTER_ALONE_BELOW_S / 8 * 1.01) == (8, 2)
    assert node_layout(0, "auto", 3, crowded=True, step_s=1e-3) == (33, 0)
    assert node_layout(0, 0, 3, step_s=cheap) == (33, 0)        # a number is kept
    for n in range(3, 40):
        for w in (1, 2, 3):
            if n > w:
                m = auto_share(n, w)
                assert 0 <= m <= n - w and (n - m) % w == 0
    with pytest.raises(ConfigError, match="^master_envs: 8 of num_envs 8 leaves 0"):
        node_layout(8, 8.0, 2)
    with pytest.raises(ConfigError, match="^master_envs: 3 of num_envs 8 leaves 5"):
        node_layout(8, 3.0, 2)
    with pytest.raises(ConfigError, match="^num_envs: 2 environments for a master and 2"):
        node_layout(2, "auto", 2)


# ---- PAAC through the entry point ------------------------------------------------------

FAST = ["--algo", "paac", "--eval-episodes", "2", "--progress-every", "0.5",
        "--hidden", "32", "32", "--eval-every", "0"]


def _launch(n, run_dir, *flags, timeout=150):
    return subprocess.run(pal_main(n, *FAST, "--run-dir", str(run_dir), *flags), cwd=ROOT,
                          env=mpi_env(), capture_output=True, text=True, timeout=timeout)


def _result(run_dir):
    """(summary, final parameters' digest, the episodes' rows without wall times)."""
    s = json.loads((run_dir / "summary.json").read_text())
    with h5py.File(s["checkpoint"], "r") as f:
        digest = f.attrs["params_digest"]
    ep = read_run_metrics(run_dir)["episodes"]
    rows = sorted(zip(ep["env_step"].tolist(), ep["actor"].tolist(), ep["return"].tolist(),
                      ep["length"].tolist()))
    return s, digest, rows


@pytest.mark.mpi
def test_paac_is_bit_identical_with_and_without_the_share(tmp_path):
    """One node: -n 3 without a share, with one of 4, with all (the workers idle) and
    with auto (the default), and -n 1 (the master steps all 8): one final digest and
    the same episodes, each logged once."""
    base = ["--num-envs", "8", "--total-steps", "4000"]
    runs = {"n3": (3, ["--master-envs", "0"]), "n3-share4": (3, ["--master-envs", "4"]),
            "n3-all": (3, ["--master-envs", "all"]), "n3-auto": (3, []),
            "n1": (1, ["--master-envs", "3"])}
    results = {}
    for name, (n, flags) in runs.items():
        proc = _launch(n, tmp_path / name, *base, *flags)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        results[name] = _result(tmp_path / name)
    s, digest, rows = results["n3"]
    assert s["master_envs"] == [0] and len(rows) > 20
    assert results["n3-share4"][0]["master_envs"] == [4]
    s_all = results["n3-all"][0]
    assert s_all["master_envs"] == [8] and s_all["idle_ranks"] == 2
    assert s_all["env_worker_busy"] is None and s_all["env_step_s"] is None
    crowded = 3 > len(os.sched_getaffinity(0))
    s_auto = results["n3-auto"][0]                      # the rule on the measured step
    assert 0 < s_auto["env_step_s"] < 0.01
    assert s_auto["master_envs"] == [node_layout(8, "auto", 2, crowded,
                                                 s_auto["env_step_s"])[1]]
    assert results["n1"][0]["master_envs"] == [8] and results["n1"][0]["env_workers"] == 0
    assert {r[1] for r in rows} == set(range(8))       # the share's envs log episodes too
    for name, (s2, d2, rows2) in results.items():
        assert d2 == digest, name
        assert rows2 == rows, name
        assert s2["updates"] == s["updates"] and s2["episodes"] == s["episodes"], name


@pytest.mark.mpi
def test_virtual_nodes_with_a_share_match_and_resume_exactly(tmp_path):
    """Two virtual nodes of 2 ranks (a master and one worker each), the master stepping
    4 of its node's 8 envs: the same digest as without the share, masters identical;
    stopped at 2,000 steps and resumed to 4,000 with the share, the result equals the
    same resumed run without it."""
    base = ["--ranks-per-node", "2", "--num-envs", "8"]
    digests = {}
    for name, flags in (("plain", []), ("share", ["--master-envs", "4"])):
        run_dir = tmp_path / name
        proc = _launch(4, run_dir, *base, *flags, "--total-steps", "2000")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        first, d1, _ = _result(run_dir)
        assert first["learner_params_identical"] and first["num_envs"] == [8, 8]
        proc = _launch(4, run_dir, *base, *flags, "--total-steps", "4000",
                       "--resume", "latest")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        second, d2, _ = _result(run_dir)
        assert second["params_digest_at_start"] == d1          # restored bit for bit
        assert second["learner_params_identical"] and second["updates"] > first["updates"]
        digests[name] = (d1, d2)
    assert digests["plain"] == digests["share"]


@pytest.mark.mpi
@pytest.mark.parametrize("flags, message", [
    (["--num-envs", "9", "--master-envs", "9"],
     "master_envs: 9 of num_envs 9 leaves 0 environments for 3 worker ranks"),
    (["--num-envs", "9", "--master-envs", "2"], "master_envs: 2 of num_envs 9 leaves 7"),
    (["--master-envs", "1.5"], "master_envs: must be auto, all or an integer >= 0"),
    (["--master-envs", "-1"], "master_envs: must be auto, all or an integer >= 0"),
])
def test_bad_shares_are_refused_before_work(tmp_path, flags, message):
    proc = _launch(4, tmp_path / "run", *flags, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert not (tmp_path / "run" / "metrics.h5").exists()
