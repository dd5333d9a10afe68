"""FrameStackReplay on one process: rebuilt stacks equal the env's (gymnasium's
FrameStackObservation over stamped frames), the samplable set is exactly the rows
whose whole window and successor are stored, stale tickets are dropped, checkpoints
round-trip, and bad specs are refused."""

import h5py
import numpy as np
import pytest

from frame_streams import Streams, check_sample, stamp_env
from pal_hpc.replay import FrameStack, FrameStackReplay, SharedReplay
from pal_hpc.runtime.nstep import transition_spec

STACK = 4


def spec(frame=(8, 8)):
    return transition_spec((STACK,) + frame, np.uint8, frame_stack=True)


def make(capacity, streams, n_step, regions=1, **kw):
    return FrameStackReplay(spec(), capacity, regions=regions, streams=streams, n_step=n_step,
                            **kw)


def run(st: Streams, steps: int, every: int = 10) -> None:
    for t in range(steps):
        st.step()
        if t % every == every - 1:
            st.flush()
    st.flush()


def expected_live(rb, streams: Streams) -> set[int]:
    """Slots whose row is a transition with its successor written and its whole
    window [max(first, u-stack+1), u+k] still stored (computed from the columns)."""
    live = set()
    cols = rb._columns
    for q in range(rb.regions * rb.streams):
        w = int(rb._control[rb._stream_word(q)])
        base = q * rb.stream_len
        for u in range(max(0, w - rb.stream_len), w):
            slot = base + u % rb.stream_len
            k, first = int(cols["_k"][slot]), int(cols["_first"][slot])
            lo = max(first, u - STACK + 1)
            if k > 0 and u + k < w and lo >= w - rb.stream_len:
                succ = base + (u + k) % rb.stream_len
                if int(cols["_first"][succ]) == first:
                    live.add(slot)
    return live


@pytest.mark.parametrize("n_step,n_envs", [(1, 1), (3, 1), (3, 3), (5, 2)])
def test_stacks_are_the_envs_and_only_complete_windows_are_live(n_step, n_envs):
    rb = make(n_envs * 40, n_envs, n_step)
    st = Streams(rb, 0, [stamp_env(i) for i in range(n_envs)], n_step)
    rng = np.random.default_rng(1)
    for t in range(600):
        st.step()
        if t % 7 == 6:
            st.flush()
            live = set(np.flatnonzero(rb.priorities(np.arange(rb.capacity)) > 0).tolist())
            assert live == expected_live(rb, st), f"step {t}"
            if t < 20:
                continue
            assert live, "nothing samplable"
            s = rb.sample(64, rng=rng)
            assert check_sample(s, st.by_slot) == []
            assert set(s["indices"].tolist()) <= live


def test_episode_start_is_padded_with_its_reset_frame():
    rb = make(200, 1, 1)
    env = stamp_env(0, max_steps=3)
    st = Streams(rb, 0, [env], 1)
    for _ in range(40):
        st.step()
    st.flush()
    firsts = rb._columns["_first"]
    steps = rb._columns["_step"]
    starts = [slot for slot, ref in st.by_slot.items()
              if ref is not None and firsts[slot] == steps[slot]
              and rb.priorities([slot])[0] > 0]
    assert len(starts) >= 10
    s = rb._outputs(len(starts))
    tk, pr, ok = (np.zeros(len(starts), d) for d in (np.uint64, np.float32, np.uint8))
    assert rb._copy_out(np.array(starts, np.int64), s, tk, pr, ok) == len(starts)
    assert check_sample({**s, "indices": np.array(starts)}, st.by_slot) == []
    for b in range(len(starts)):
        assert all(np.array_equal(s["obs"][b][0], s["obs"][b][j]) for j in range(STACK))


def test_tickets_of_overwritten_or_invalidated_rows_are_dropped():
    rb = make(60, 1, 3)
    st = Streams(rb, 0, [stamp_env(0, max_steps=1000)], 3)
    for _ in range(50):
        st.step()
    st.flush()
    s = rb.sample(32, rng=0)
    sampled_steps = rb._columns["_step"][s["indices"]].copy()
    for _ in range(30):         # overwrites the oldest rows and breaks the windows after them
        st.step()
    st.flush()
    live = set(np.flatnonzero(rb.priorities(np.arange(rb.capacity)) > 0).tolist())
    # Current: the same row is still there and its window is whole.
    current = [i in live and rb._columns["_step"][i] == u
               for i, u in zip(s["indices"].tolist(), sampled_steps.tolist())]
    applied = rb.update_priorities(s["indices"], np.full(32, 5.0), s["tickets"])
    assert applied == sum(current) and 0 < applied < 32
    assert set(np.flatnonzero(rb.priorities(np.arange(rb.capacity)) > 0).tolist()) == live


def test_checkpoint_round_trip_resumes_exactly(tmp_path):
    rb = make(3 * 50, 3, 3)
    st = Streams(rb, 0, [stamp_env(i) for i in range(3)], 3)
    run(st, 90)
    path = tmp_path / "replay.h5"
    with h5py.File(path, "w") as f:
        for name, arr in rb.state_arrays().items():
            f.create_dataset(name, data=arr)
    assert sum(f"column.obs" == k for k in rb.state_arrays()) == 1
    back = make(3 * 50, 3, 3)
    with h5py.File(path, "r") as f:
        back.load_state_arrays({k: f[k] for k in f})
    assert np.array_equal(back.state_bytes(), rb.state_bytes())
    a, b = rb.sample(32, rng=7), back.sample(32, rng=7)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    # Writing on goes on from the restored cursors: the same rows land in the same slots.
    st.rb = back
    run(st, 30)
    assert check_sample(back.sample(64, rng=3), st.by_slot) == []


def test_saved_rows_are_the_deduplicated_ones():
    rb = make(1000, 2, 3)
    st = Streams(rb, 0, [stamp_env(i) for i in range(2)], 3)
    run(st, 100)
    state = rb.state_arrays()
    assert state["column.obs"].shape == (rb.size(), 8, 8)
    assert rb.size() == sum(rb.stream_writes(0, q) for q in range(2))


def test_bad_specs_and_capacities_are_refused():
    with pytest.raises(ValueError, match="image frames"):
        FrameStackReplay({"obs": FrameStack((4,), np.float32, 4)}, 100)
    with pytest.raises(ValueError, match="image frames"):
        FrameStackReplay({"obs": FrameStack((8, 8), np.float32, 4)}, 100)
    with pytest.raises(ValueError, match="slots per stream"):
        FrameStackReplay(spec(), 14, streams=2, n_step=3)
    with pytest.raises(ValueError, match="a stack of 10 frames"):     # stack > capacity
        FrameStackReplay({"obs": FrameStack((8, 8), np.uint8, 10)}, 8)
    with pytest.raises(ValueError, match="FrameStackReplay"):
        SharedReplay(spec(), 100)
    rb = make(100, 1, 3)
    frame = np.zeros((2, 8, 8), np.uint8)
    row = {"obs": frame, "action": np.zeros(2, np.int64), "reward": np.zeros(2, np.float32),
           "discount": np.zeros(2, np.float32), "nstep": np.array([1, 1]),
           "episode_start": np.array([False, False])}
    with pytest.raises(ValueError, match="none is open"):
        rb.add(0, row)
    with pytest.raises(ValueError, match="nstep values"):
        rb.add(0, {**row, "nstep": np.array([4, 1]), "episode_start": np.array([True, False])})
    with pytest.raises(ValueError, match="newest frame"):
        rb.add(0, {**row, "obs": np.zeros((2, 4, 8, 8), np.uint8)})
    assert rb.size() == 0


def test_pong_scale_bytes_per_transition():
    need = FrameStackReplay.window_nbytes(spec((84, 84)), 1_000_000, regions=3, streams=4,
                                          n_step=3)
    assert need / 1e6 < 7200          # one 7,056-byte frame + ~40 bytes of fields/tree
    assert need < 7.5e9
