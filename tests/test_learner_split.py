"""The global batch split among learners (`--learner-batch split`): the shares, and one
update with L learners -- each differentiating its share, the share-weighted gradients
summed as the Allreduce sums them -- equal to one learner's update on the union of the
shares, for DQN, TD3 and SAC (noise drawn per row included); the same under mpiexec
with the real Learner, SharedReplay and Allreduce (tests/mpi/learner_split_check.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from algo_checks import make_split_algo as make_algo, make_split_batch as make_batch
from pal_hpc.runtime.learner import batch_shares

ROOT = Path(__file__).resolve().parent.parent


def split_update(learners: list, u: int, batch: dict, total: int) -> list[np.ndarray]:
    """One update of `learners` on `batch` split as the runtime splits it: each phase's
    gradients times their rows, summed (the Allreduce), applied with 1 / rows.
    Returns each learner's priorities."""
    shares = batch_shares(total, len(learners))
    starts = np.cumsum([0, *shares])
    prios = [None] * len(learners)
    for phase in learners[0].phases(u):
        summed = np.zeros(learners[0].phase_size(phase), np.float32)
        for i, algo in enumerate(learners):
            rows = {k: v[starts[i]:starts[i + 1]] for k, v in batch.items()}
            out = np.zeros_like(summed)
            _, p = algo.compute_gradients(phase, rows, out)
            prios[i] = p if p is not None else prios[i]
            summed += np.float32(shares[i]) * out
        for algo in learners:
            algo.apply_gradients(phase, summed.copy(), scale=1.0 / total)
    return prios


def test_batch_shares_differ_by_at_most_one_and_sum_to_the_batch():
    for batch in (1, 7, 64, 256, 257):
        for n in range(1, min(batch, 17) + 1):
            s = batch_shares(batch, n)
            assert sum(s) == batch and len(s) == n and max(s) - min(s) <= 1
    assert batch_shares(7, 2) == [4, 3] and batch_shares(256, 3) == [86, 85, 85]


@pytest.mark.parametrize("name", ["dqn", "td3", "sac"])
@pytest.mark.parametrize("n_learners", [2, 3])
def test_split_update_equals_one_learner_on_the_union(name, n_learners):
    total = 11                                    # shares 6/5 and 4/4/3: uneven on purpose
    one = make_algo(name)
    many = [make_algo(name) for _ in range(n_learners)]
    shares = batch_shares(total, n_learners)
    for i, algo in enumerate(many):
        algo.set_rows(sum(shares[:i]), total)
    rng = np.random.default_rng(1)
    for u in range(4):                            # TD3's actor phase on updates 1 and 3
        batch = make_batch(name, rng, total)
        prio_one = split_update([one], u, batch, total)[0]
        prios = split_update(many, u, batch, total)
        np.testing.assert_allclose(np.concatenate(prios), prio_one, rtol=1e-4, atol=1e-6)
    digests = {algo.digest() for algo in many}
    assert len(digests) == 1                       # the learners stay bit-identical
    for got, want in zip(many[0].state_arrays(), one.state_arrays()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    # ... and the learning moved them: the comparison is not between two initial states.
    assert any(not np.array_equal(a, b) for a, b in
               zip(one.state_arrays(), make_algo(name).state_arrays()))


@pytest.mark.parametrize("name", ["td3", "sac"])
def test_without_row_slicing_the_split_draws_other_noise(name):
    """The row slicing is what makes the noise match: learners that each draw their
    own share's noise from the same stream do not reproduce the union's update."""
    total = 8
    one, many = make_algo(name), [make_algo(name), make_algo(name)]
    batch = make_batch(name, np.random.default_rng(2), total)
    for u in range(2):
        split_update([one], u, batch, total)
        split_update(many, u, batch, total)
    diff = max(np.abs(a - b).max() for a, b in zip(many[0].state_arrays(), one.state_arrays()))
    assert diff > 1e-5


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_learners_under_mpi_match_one_learner_on_the_union(mpi, nprocs):
    proc = mpi(nprocs, ROOT / "tests/mpi/learner_split_check.py", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"learners={nprocs} " in proc.stdout and "ok=True" in proc.stdout, proc.stdout
