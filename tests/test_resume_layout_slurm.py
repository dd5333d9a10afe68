"""jobs/*.sbatch resume whatever allocation they get, under the throw-away SLURM of
tests/slurm_cluster.py: a run that multi_node.sbatch checkpointed on 2 nodes x 2 ranks
is continued (PAL_RUN_DIR, --resume auto) by single_node.sbatch on 1 node x 3 ranks.
Skips where SLURM cannot be set up, as tests/test_slurm.py does."""

import pytest

from test_slurm import Job, _no_jobs_left, cluster  # noqa: F401  (the fixtures)

pytestmark = pytest.mark.mpi


def test_a_run_continues_on_a_smaller_allocation(cluster, tmp_path):  # noqa: F811
    # 2 ranks a node (not test_slurm's 4): the layout changes all the same (2 nodes -> 1,
    # 4 ranks -> 3), and 8 ranks on 2 cores beside the other pytest worker's job took 2 min.
    first = Job(cluster, tmp_path, "multi_node.sbatch", "--nodes=2", "--ntasks-per-node=2",
                args=("--total-steps", "3000"))
    info = first.wait_final(timeout=300)
    assert info["JobState"] == "COMPLETED", (info, first.output)
    saved = first.summary()
    # The script's learners per node are a share of the node's ranks (1 of 2 here).
    assert saved["learners"] == saved["nodes"] and saved["exit_status"] == 0, saved

    second = Job(cluster, tmp_path, "single_node.sbatch", "--ntasks-per-node=3",
                 args=("--total-steps", "5000"))
    info = second.wait_final(timeout=300)
    out = second.output
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, out)
    summary = second.summary()
    assert summary["resumed_from"] == saved["checkpoint"], summary
    assert summary["params_digest_at_start"] == saved["params_digest"], summary
    assert summary["ranks"] == 3 and summary["nodes"] == 1 and summary["env_steps"] >= 5000
    assert "-> 1 node x 3 ranks (2 actors, 1 learner)" in out, out
    assert "(3 ranks on 1 node(s))" in out, out
