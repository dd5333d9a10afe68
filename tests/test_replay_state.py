"""SharedReplay checkpoints: state_arrays() holds only written rows and
load_state_arrays() restores the buffer exactly, or refuses before changing it."""

import h5py
import numpy as np
import pytest

from pal_hpc.replay import SharedReplay
from pal_hpc.replay._replaycore import writes_word

SPEC = {"obs": ((4,), np.float32), "action": ((), np.int64), "done": ((), np.bool_)}
CAP, REGIONS = 1000, 4                                   # regions of 250 slots


def batch(n, rng):
    return {"obs": rng.standard_normal((n, 4)).astype(np.float32),
            "action": rng.integers(0, 2**40, n), "done": rng.random(n) < 0.5}


@pytest.fixture
def saved():
    """A buffer with region 0 wrapped, 1 empty, 2 partly and 3 exactly full, new
    priorities on some slots, a sample count, and a region claim left held."""
    rng = np.random.default_rng(0)
    rb = SharedReplay(SPEC, CAP, regions=REGIONS)
    for region, n in [(0, 200), (2, 17), (3, 250), (0, 100)]:
        rb.add(region, batch(n, rng))
    s = rb.sample(300, rng=rng)
    rb.update_priorities(s["indices"], rng.random(300) * 5, s["tickets"])
    assert rb._core.try_acquire_region(3)                # a writer stopped mid-claim
    yield rb, rb.state_arrays()
    rb.close()


def dirty_buffer():
    """A buffer of the same signature that holds other data everywhere."""
    rng = np.random.default_rng(1)
    rb = SharedReplay(SPEC, CAP, regions=REGIONS)
    for region in range(REGIONS):
        rb.add(region, batch(250, rng))
        rb.add(region, batch(30, rng))
    return rb


def test_round_trip_is_exact(saved):
    rb, state = saved
    np.testing.assert_array_equal(state["region_rows"], [250, 0, 17, 250])
    assert state["column.obs"].shape == (517, 4)
    other = dirty_buffer()
    other.load_state_arrays(state)
    assert other.signature() == rb.signature()
    other.add(3, batch(1, np.random.default_rng(3)))    # the saved claim was released...
    other.load_state_arrays(state)
    rb._core.release_region(3)                         # ...as the writer would have done
    # Byte for byte: cursors, tree, counters, written rows, and zeros elsewhere.
    np.testing.assert_array_equal(other.state_bytes(), rb.state_bytes())
    assert other.total() == rb.total() and other.size() == rb.size() == 517
    assert [other.writes(r) for r in range(REGIONS)] == [300, 0, 17, 250]
    assert other.sampled() == rb.sampled() and other.max_priority() == rb.max_priority()
    np.testing.assert_array_equal(other.priorities(np.arange(CAP)), rb.priorities(np.arange(CAP)))
    a, b = rb.sample(256, rng=5), other.sample(256, rng=5)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    # Same insert cursors.
    more = batch(40, np.random.default_rng(2))
    for r in range(REGIONS):
        np.testing.assert_array_equal(other.add(r, more), rb.add(r, more))
    other.close()


def test_round_trip_through_h5py_datasets(saved, tmp_path):
    """The runtime writes one dataset per key and may hand the datasets back as they are."""
    rb, state = saved
    with h5py.File(tmp_path / "replay.h5", "w") as f:
        for key, arr in state.items():
            f.create_dataset(key, data=arr)
    other = dirty_buffer()
    with h5py.File(tmp_path / "replay.h5", "r") as f:
        other.load_state_arrays({key: f[key] for key in f})
    rb._core.release_region(3)
    np.testing.assert_array_equal(other.state_bytes(), rb.state_bytes())
    other.close()


def test_state_size_follows_what_was_written():
    spec = {"obs": ((16,), np.float32), "action": ((), np.int64)}
    with SharedReplay(spec, 1_000_000, regions=4) as rb:
        rb.add(1, {"obs": np.ones((100, 16), np.float32), "action": np.arange(100)})
        state = rb.state_arrays()
        fixed = state["tree"].nbytes + state["seq"].nbytes
        assert state["column.obs"].shape == (100, 16)
        rest = sum(a.nbytes for a in state.values()) - fixed
        assert rest < 0.001 * (rb.nbytes - fixed), rest
        assert not state["seq"].flags.writeable            # views of the live buffer
        empty = SharedReplay(spec, 1_000_000, regions=4).state_arrays()
        assert empty["column.action"].shape == (0,)


def corruptions(state):
    """(name, change) pairs; each change must be refused, naming what is wrong."""
    def with_(key, value):
        return key, {**state, key: value}
    control = state["control"].copy()
    control[writes_word(2)] += 1                       # region 2's insert counter
    tree = state["tree"].copy()
    tree[0] ^= 1                                       # the header's magic
    seq = state["seq"].copy()
    seq[300] = 2                                       # region 1 was never written
    return [
        with_("control", state["control"].astype(np.int64)),
        with_("tree", state["tree"][:-64]),
        with_("seq", state["seq"][:-1]),
        with_("region_rows", state["region_rows"].astype(np.int32)),
        with_("region_rows", np.array([250, 0, 17, 249])),
        with_("column.obs", state["column.obs"].astype(np.float64)),
        with_("column.obs", state["column.obs"][:-1]),
        with_("column.done", state["column.done"].reshape(-1, 1)),
        ("region_rows", {**state, "control": control}),
        ("tree", {**state, "tree": tree}),
        ("seq", {**state, "seq": seq}),
        ("column.action", {k: v for k, v in state.items() if k != "column.action"}),
        ("column.reward", {**state, "column.reward": state["column.obs"]}),
    ]


def test_bad_state_is_refused_unchanged(saved):
    _, state = saved
    other = dirty_buffer()
    before = other.state_bytes().copy()
    for name, bad in corruptions(state):
        with pytest.raises(ValueError, match=name.replace(".", r"\.")):
            other.load_state_arrays(bad)
        np.testing.assert_array_equal(other.state_bytes(), before, err_msg=name)
    with pytest.raises(TypeError, match="mapping"):
        other.load_state_arrays([("tree", state["tree"])])
    other.close()
