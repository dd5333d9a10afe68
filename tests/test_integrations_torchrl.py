"""pal_hpc.integrations.torchrl: KSumPrioritizedSampler in torchrl's buffers, on the
behaviours torchrl's own suite checks its PrioritizedSampler for (pytorch/rl
test/rb/: prioritized, samplers, composable, rb_core), plus the bad input the tree refuses."""

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import (LazyMemmapStorage, LazyTensorStorage, ListStorage, ReplayBuffer,
                          TensorDictReplayBuffer)
from torchrl.data.replay_buffers.samplers import PrioritizedSampler, RandomSampler
from torchrl.data.replay_buffers.writers import RoundRobinWriter, TensorDictMaxValueWriter

from pal_hpc.integrations.torchrl import KSumPrioritizedSampler as Sampler

torch.set_num_threads(1)


def tree_values(sampler):
    """What the tree holds per slot: (p + eps) ** alpha."""
    return sampler._per.tree.get(np.arange(sampler.max_size))


def data(n, key="td_error", prio=None):
    td = {"a": torch.randn(n, 1), "_idx": torch.arange(n)}
    if prio is not None:
        td[key] = prio
    return TensorDict(td, [n])


def test_is_a_prioritized_sampler_and_refuses_no_replacement():
    assert isinstance(Sampler(10, 0.7, 0.5), PrioritizedSampler)
    with pytest.raises(TypeError, match="no without-replacement variant"):
        Sampler(10, 0.7, 0.5, replacement=False)
    with pytest.raises(ValueError, match="only supports the default RandomSampler"):
        ReplayBuffer(storage=ListStorage(10), sampler=Sampler(10, 1.0, 1.0),
                     consume_after_n_samples=1)


@pytest.mark.parametrize("alpha", [0.0, 0.7])
@pytest.mark.parametrize("key", ["pk", "td_error"])
def test_tensordict_buffer_samples_overwrites_and_strong_update(alpha, key):
    torch.manual_seed(0)
    np.random.seed(0)
    rb = TensorDictReplayBuffer(sampler=Sampler(5, alpha=alpha, beta=0.9), priority_key=key,
                                storage=ListStorage(5), batch_size=5)
    td1 = data(3, key, torch.rand(3) / 10)
    rb.extend(td1)
    s = rb.sample()
    assert s.batch_size == (5,)
    assert (td1[s["_idx"]]["a"] == s["a"]).all()
    td2 = data(5, key, torch.rand(5) / 10)         # overwrites everything
    rb.extend(td2)
    s = rb.sample()
    assert (td2[s["_idx"]]["a"] == s["a"]).all()
    assert (s["priority_weight"] > 0).all() and s["index"].shape == (5,)
    if alpha == 0.0:
        np.testing.assert_allclose(s["priority_weight"].numpy(), 1.0)
        return
    first = s["index"][0]
    s[key] = torch.where(s["index"] == first, 1e8, s[key])
    rb.update_tensordict_priority(s)
    for _ in range(3):
        s = rb.sample()
        assert (s["index"] == first).all()


@pytest.mark.parametrize("reduction", ["min", "max", "median", "mean"])
def test_trajectory_priorities_are_reduced(reduction):
    rb = TensorDictReplayBuffer(sampler=Sampler(5, alpha=1.0, beta=0.9, eps=0.0,
                                                reduction=reduction),
                                priority_key="td_error", batch_size=3)
    traj = TensorDict({"obs": torch.randn(3, 4, 5)}, [3, 4])
    rb.extend(traj)
    s = rb.sample()
    assert s.batch_size == (3, 4)
    s["td_error"] = torch.rand(3, 4) + 0.1
    rb.update_tensordict_priority(s)
    want = {"min": lambda x: x.min(-1).values, "max": lambda x: x.max(-1).values,
            "median": lambda x: x.median(-1).values, "mean": lambda x: x.mean(-1)}[reduction]
    rows = s["index"][:, 0]
    last = {int(r): i for i, r in enumerate(rows)}          # the last write of a row wins
    for r, i in last.items():
        assert rb.sampler.priorities()[r] == pytest.approx(float(want(s["td_error"][i])), rel=1e-6)
    assert (rb.sample()["priority_weight"] > 0).all()


@pytest.mark.parametrize("within", [False, True])
@pytest.mark.parametrize("alpha", [0.4, 0.7])
def test_new_item_gets_the_max_priority_once_raised_to_alpha(alpha, within):
    s = Sampler(10, alpha=alpha, beta=0.9, max_priority_within_buffer=within)
    s.update_priority(torch.tensor([0]), torch.tensor([100.0]))
    s.mark_update(torch.tensor([1]))
    vals = tree_values(s)
    assert vals[1] == pytest.approx((100.0 + s.eps) ** alpha, rel=1e-6)
    assert vals[1] == vals[0]
    assert s.default_priority == pytest.approx(100.0)


def test_within_buffer_max_is_raw_and_follows_the_buffer():
    s = Sampler(5, alpha=0.6, beta=0.9, max_priority_within_buffer=True)
    s.update_priority(torch.tensor([0, 1]), torch.tensor([100.0, 10.0]))
    s.update_priority(torch.tensor([0]), torch.tensor([50.0]))
    assert s._max_priority[0] == pytest.approx(50.0) and s._max_priority[1] == 0
    s.mark_update(torch.tensor([2]))
    assert tree_values(s)[2] == pytest.approx((50.0 + s.eps) ** 0.6, rel=1e-6)


@pytest.mark.parametrize("within", [True, False])
@pytest.mark.parametrize("alpha", [1.0, 0.6])
def test_max_priority_since_creation_or_within_buffer(within, alpha):
    rb = ReplayBuffer(storage=LazyTensorStorage(11),
                      sampler=Sampler(11, alpha=alpha, beta=1.0, max_priority_within_buffer=within))
    for x in range(20):
        idx = rb.add(torch.tensor(x))
        rb.update_priority(idx, 21 - x)
        if x <= 10 or not within:
            assert rb.sampler._max_priority == (pytest.approx(21.0), 0)
        else:   # the oldest row still stored holds the max
            assert rb.sampler._max_priority == (pytest.approx(31.0 - x), x - 10)
            vals = tree_values(rb.sampler)
            assert vals.max() == pytest.approx((31.0 - x + rb.sampler.eps) ** alpha, rel=1e-5)
            assert vals.argmax() == x - 10
    idx = rb.extend(torch.arange(10))
    rb.update_priority(idx, 12)
    assert rb.sampler._max_priority[0] == pytest.approx(12.0 if within else 21.0)


@pytest.mark.parametrize("new_alpha", [0.5, 0.0, 2.0])
def test_alpha_change_re_raises_every_priority(new_alpha):
    rb = ReplayBuffer(storage=LazyTensorStorage(10), sampler=Sampler(10, alpha=1.0, beta=1.0))
    idx = rb.extend(torch.arange(6))
    rb.update_priority(idx, torch.arange(1.0, 7.0))
    rb.sampler.alpha = new_alpha
    vals = tree_values(rb.sampler)
    np.testing.assert_allclose(vals[:6], (np.arange(1.0, 7.0) + rb.sampler.eps) ** new_alpha,
                               rtol=1e-6)
    assert (vals[6:] == 0).all()
    rb.sampler.alpha = 0.7                      # from alpha 0 too: exact, p is kept
    np.testing.assert_allclose(tree_values(rb.sampler)[:6],
                               (np.arange(1.0, 7.0) + rb.sampler.eps) ** 0.7, rtol=1e-6)
    with pytest.raises(ValueError, match="alpha"):
        rb.sampler.alpha = -1.0
    with pytest.raises(ValueError, match="beta"):
        rb.sampler.beta = float("nan")


def test_state_dict_round_trip_is_decoupled():
    s = Sampler(10, alpha=0.7, beta=0.9)
    s.extend(torch.arange(5))
    s.update_priority(torch.arange(5), torch.arange(1.0, 6.0))
    sd = s.state_dict()
    s2 = Sampler(10, alpha=0.5, beta=0.1)
    s2.load_state_dict(sd)
    assert (s2.alpha, s2.beta, s2._max_priority) == (0.7, 0.9, (5.0, 4))
    np.testing.assert_array_equal(tree_values(s2), tree_values(s))
    sd["_priorities"][0] += 1000.0
    np.testing.assert_array_equal(s2.priorities(), s.priorities())
    with pytest.raises(ValueError, match="max_capacity"):
        Sampler(11, 0.7, 0.9).load_state_dict(s.state_dict())


def test_buffer_dumps_and_loads(tmp_path):
    rb = ReplayBuffer(storage=LazyMemmapStorage(10), sampler=Sampler(10, alpha=0.8, beta=0.6))
    td = TensorDict({"obs": torch.zeros(3, 3)}, [3])
    rb.update_priority(rb.extend(td), torch.tensor([1.0, 5.0, 2.0]))
    rb.dumps(tmp_path)
    rb2 = ReplayBuffer(storage=LazyMemmapStorage(10), sampler=Sampler(10, alpha=0.5, beta=0.5))
    rb2.extend(TensorDict({"obs": torch.ones(1, 3)}, [1]))
    rb2.loads(tmp_path)
    assert len(rb2) == 3
    assert (rb2.sampler.alpha, rb2.sampler.beta) == (0.8, 0.6)
    assert rb2.sampler._max_priority == rb.sampler._max_priority
    np.testing.assert_array_equal(rb2.sampler.priorities(), rb.sampler.priorities())
    with pytest.raises(ValueError, match="max_capacity"):
        Sampler(12, 0.8, 0.6).loads(tmp_path / "sampler")


def test_new_sampler_over_a_filled_storage_starts_at_default_priority():
    storage = LazyTensorStorage(10)
    rb = TensorDictReplayBuffer(storage=storage, sampler=Sampler(10, 0.7, 0.5), batch_size=2,
                                priority_key="td_error")
    rb.extend(TensorDict({"state": torch.ones(4, 2), "td_error": torch.ones(4) * 0.5}, [4]))
    fresh = TensorDictReplayBuffer(storage=storage, sampler=Sampler(4, 0.7, 0.5), batch_size=2,
                                   priority_key="td_error")
    assert fresh.sample().batch_size == (2,)
    np.testing.assert_allclose(tree_values(fresh.sampler), (1.0 + 1e-8) ** 0.7, rtol=1e-6)


@pytest.mark.parametrize("cls", [ReplayBuffer, TensorDictReplayBuffer])
@pytest.mark.parametrize("ndim", [1, 2])
def test_update_priority_by_index_1d_and_2d(cls, ndim):
    torch.manual_seed(0)
    rb = cls(sampler=Sampler(100, alpha=1.0, beta=1.0, eps=0.0),
             storage=LazyTensorStorage(100, ndim=ndim), batch_size=4)
    shape = [10] if ndim == 1 else [2, 5]
    idx = rb.extend(TensorDict({"a": torch.arange(10).reshape(shape)}, shape))
    np.testing.assert_array_equal(tree_values(rb.sampler)[:10], 1.0)
    rb.update_priority(idx, 2)
    np.testing.assert_array_equal(tree_values(rb.sampler)[:10], 2.0)
    s, info = rb.sample(return_info=True)
    index = info["index"]
    rb.update_priority(index, 10_000)
    flat = index if ndim == 1 else torch.as_tensor(
        np.ravel_multi_index(tuple(i.numpy() for i in index), tuple(rb.storage.shape)))
    assert (tree_values(rb.sampler)[flat.numpy()] == 10_000).all()
    again = rb.sample(return_info=True)[1]["index"]
    again = again if ndim == 1 else torch.stack(again, -1)
    before = index if ndim == 1 else torch.stack(index, -1)
    # every new draw is one of the rows just given a huge priority
    match = (again.unsqueeze(0) == before.unsqueeze(1))
    assert (match if ndim == 1 else match.all(-1)).any(0).all()


def test_generator_makes_sampling_reproducible():
    state = torch.random.get_rng_state()
    rb = ReplayBuffer(sampler=Sampler(100, 1.0, 1.0), storage=LazyTensorStorage(100),
                      generator=torch.Generator())
    rb.extend(torch.arange(100))
    rb.update_priority(index=torch.arange(100), priority=torch.arange(1, 101))
    rb._rng.set_state(state)
    a = rb.sample(32)
    rb._rng.set_state(state)
    assert (rb.sample(32) == a).all()
    assert (rb.sample(32) != a).any()


def test_shared_storage_and_writer():
    storage, writer = LazyMemmapStorage(100), RoundRobinWriter()
    rb0 = ReplayBuffer(storage=storage, writer=writer, sampler=RandomSampler(), batch_size=10)
    rb1 = ReplayBuffer(storage=storage, writer=writer, sampler=Sampler(100, 0.7, 1.1),
                       batch_size=10)
    rb0.extend(TensorDict({"a": torch.arange(50)}, [50]))
    assert len(rb1) == 50
    rb1.sample()
    vals = tree_values(rb1.sampler)
    assert vals[:50].sum() == pytest.approx(50.0) and vals[50:].sum() == 0


@pytest.mark.parametrize("size", [3, 5, 100])
@pytest.mark.parametrize("storage,datatype", [
    (ListStorage, "tensor"), (LazyTensorStorage, "tensor"), (LazyTensorStorage, "tensordict"),
    (LazyTensorStorage, "pytree"), (LazyMemmapStorage, "tensordict")])
@pytest.mark.parametrize("writer", [RoundRobinWriter, TensorDictMaxValueWriter])
def test_composable_add_extend_sample(size, storage, datatype, writer):
    torch.manual_seed(0)
    rb = ReplayBuffer(storage=storage(size), sampler=Sampler(size, alpha=0.8, beta=0.9),
                      writer=writer(), batch_size=3)

    def make(n):
        if datatype == "tensor":
            return torch.randint(100, (n, 1))
        if datatype == "tensordict":
            return TensorDict({"a": torch.randint(100, (n, 1)), "next": {"reward": torch.randn(n, 1)}}, [n])
        return {"a": torch.randint(100, (n, 1)), "b": {"c": [torch.zeros(n, 3)]}}

    batch = make(5)
    if writer is TensorDictMaxValueWriter:
        if datatype != "tensordict":
            with pytest.raises(RuntimeError, match="tensor collection"):
                rb.extend(batch)
            return
        batch["next", "reward"][:] = 1_000_000
    rb.extend(batch)
    assert len(rb) == min(size, 5)
    s, info = rb.sample(return_info=True)
    stored = [rb.storage[int(i)] for i in info["index"]]
    first = (lambda x: x["a"]) if datatype != "tensor" else (lambda x: x)
    for i, row in enumerate(stored):
        assert (first(row) == first(s)[i]).all()
    assert info["priority_weight"].shape == (3,)
    rb.update_priority(info["index"], torch.rand(3) + 0.5)
    rb.extend(make(2 * size + 2))
    assert len(rb) == size
    assert rb.sample(return_info=True)[1]["index"].max() < size


def test_sampling_is_proportional_and_weights_match_torchrl():
    p = torch.tensor([0.5, 1.0, 2.0, 4.0, 0.25])
    ours, theirs = Sampler(5, alpha=0.7, beta=0.6), PrioritizedSampler(5, alpha=0.7, beta=0.6)
    storage = LazyTensorStorage(5)
    storage.set(torch.arange(5), torch.arange(5))
    for s in (ours, theirs):
        s.update_priority(torch.arange(5), p)
    np.random.seed(0)
    counts = np.zeros(5)
    for _ in range(100):
        idx, info = ours.sample(storage, 200)
        counts += np.bincount(idx.numpy(), minlength=5)
        i2, info2 = theirs.sample(storage, 200)
        w_theirs = dict(zip(i2.tolist(), info2["priority_weight"].tolist()))
        for i, w in zip(idx.tolist(), info["priority_weight"].tolist()):
            if i in w_theirs:
                assert w == pytest.approx(w_theirs[i], rel=1e-6)
    pa = (p.double().numpy() + 1e-8) ** 0.7
    expected = pa / pa.sum() * counts.sum()
    assert ((counts - expected) ** 2 / expected).sum() < 18.5   # df=4, p=0.001


def test_bad_input_raises_the_tree_errors_and_changes_nothing():
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        Sampler(0, 0.7, 0.5)
    with pytest.raises(ValueError, match="alpha"):
        Sampler(10, -0.1, 0.5)
    with pytest.raises(ValueError, match="reduction"):
        Sampler(10, 0.7, 0.5, reduction="sum")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), sampler=Sampler(10, 0.7, 0.5),
                                priority_key="td_error", batch_size=4)
    with pytest.raises(RuntimeError, match="empty storage"):
        rb.sample()
    rb.extend(data(4, prio=torch.ones(4)))
    before = tree_values(rb.sampler).copy()
    with pytest.raises(ValueError, match=r"priorities\[1\] = -1.0"):
        rb.update_priority(torch.tensor([0, 1]), torch.tensor([2.0, -1.0]))
    with pytest.raises(ValueError, match=r"priorities\[0\] = nan"):
        rb.update_priority(torch.tensor([3]), torch.tensor([float("nan")]))
    with pytest.raises(IndexError, match=r"indices\[1\] = 10 is out of range \[0, 10\)"):
        rb.update_priority(torch.tensor([0, 10]), torch.tensor([2.0, 2.0]))
    with pytest.raises(IndexError, match="-2"):
        rb.update_priority(torch.tensor([-2]), torch.tensor([2.0]))
    with pytest.raises(ValueError, match="one priority per row"):
        rb.update_priority(torch.tensor([0, 1]), torch.tensor([2.0, 2.0, 2.0]))
    s = rb.sample()
    s["td_error"] = torch.full((4,), float("inf"))
    with pytest.raises(ValueError, match="priorities"):
        rb.update_tensordict_priority(s)
    np.testing.assert_array_equal(tree_values(rb.sampler), before)
    rb.update_priority(torch.tensor([-1, 2]), torch.tensor([9.0, 3.0]))   # -1: not written
    assert rb.sampler.priorities()[2] == pytest.approx(3.0)


def test_pickles_with_its_priorities():
    import pickle
    s = Sampler(10, alpha=0.7, beta=0.9)
    s.update_priority(torch.arange(4), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    back = pickle.loads(pickle.dumps(s))
    np.testing.assert_array_equal(tree_values(back), tree_values(s))
    assert back.default_priority == 4.0
