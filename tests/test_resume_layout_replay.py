"""Re-splitting a checkpoint's replay shards over another layout, in one process: real
SharedReplay and FrameStackReplay buffers filled (rings wrapped, priorities updated),
saved in the checkpoint's replay-file format, read back as shards and loaded into
buffers of another node count, region count, stream count and capacity.

Checked: every saved (transition, priority) comes back exactly once, or only the
newest ones when the new capacity is smaller; a frame replay's every samplable stack
and n-step successor is the one the environment emitted (the reference transitions
of tests/frame_streams.py), also after new writes overwrite loaded rows; the tree,
max priority and sample counter are what the rules say; two loads are identical; a
damaged shard is refused naming its file."""

from collections import Counter

import h5py
import numpy as np
import pytest

from frame_streams import Streams, check_sample, stamp_env
from pal_hpc.replay import FrameStack, FrameStackReplay, SharedReplay
from pal_hpc.replay.resplit import keep_counts, plan_resplit, shares
from pal_hpc.replay.resplit_load import carried_samples, load_resplit
from pal_hpc.replay.shards import ShardError, open_shard, write_shard

SPEC = {"obs": ((3,), np.float32), "action": ((), np.int64)}
N_STEP, STACK = 3, 4
FSPEC = {"obs": FrameStack((8, 8), np.uint8, STACK), "action": ((), np.int64),
         "reward": ((), np.float32), "discount": ((), np.float32)}


# -- the pure rules --------------------------------------------------------------------

def test_keep_counts_keeps_the_newest_rows_oldest_ring_last():
    rng = np.random.default_rng(0)
    for _ in range(200):
        rows = rng.integers(0, 9, rng.integers(1, 6))
        keep = int(rng.integers(0, rows.sum() + 2))
        # Brute force: every (age, ring) pair, the smallest `keep` of them.
        pairs = sorted((age, r) for r, n in enumerate(rows) for age in range(n))[:keep]
        want = np.bincount([r for _, r in pairs], minlength=rows.size)
        assert keep_counts(rows, keep).tolist() == want.tolist(), (rows, keep)


def test_shares_are_proportional_and_fit():
    rng = np.random.default_rng(1)
    for _ in range(200):
        lengths = rng.integers(0, 50, rng.integers(1, 7))
        total = int(rng.integers(0, lengths.sum() + 1))
        got = shares(total, lengths)
        assert got.sum() == total and (got <= lengths).all()
        assert (np.abs(got - total * lengths / max(1, lengths.sum())) < 1).all()


def test_carried_samples_keep_the_mean_rate_limit_state():
    class Old:
        def __init__(self, sampled, inserted):
            self.sampled, self.inserted = sampled, inserted

    old = [Old(36_800, 1_200), Old(38_720, 1_230)]      # ratio 32: 1,600 and 640 behind
    got = carried_samples(old, 900, 32.0)
    assert got == 32 * 900 - (1_600 + 640) // 2
    assert carried_samples(old, 10, 32.0) == 0          # never below zero


# -- plain replays ----------------------------------------------------------------------

def _filled_plain(capacity, regions, fills, seed):
    rb = SharedReplay(SPEC, capacity, regions=regions)
    rng = np.random.default_rng(seed)
    for r, count in enumerate(fills):
        while count > 0:
            n = int(min(count, rng.integers(1, 9)))
            rb.add(r, {"obs": rng.random((n, 3), dtype=np.float32),
                       "action": rng.integers(0, 1000, n)})
            count -= n
    s = rb.sample(32, rng=rng)
    rb.update_priorities(s["indices"], rng.random(32) * 5, s["tickets"])
    rb.sample(8, rng=rng)                     # the sample counter moves too
    return rb


def _save(tmp_path, buffers, stem="step_1_replay"):
    paths = []
    for node, rb in enumerate(buffers):
        path = tmp_path / f"{stem}{node}_ab.h5"
        with h5py.File(path, "w") as f:
            write_shard(f, rb.signature(), rb.state_arrays())
        paths.append(path)
    return paths


def _held_rows(rb, node):
    """(row bytes, priority, age, node, region) of every row a plain buffer holds."""
    out = []
    for r in range(rb.regions):
        a, b = rb.region_slots(r)
        length, w = b - a, rb.writes(r)
        for i in range(min(w, length)):
            last = i + length * ((w - 1 - i) // length)        # its latest write
            slot = a + i
            row = rb._columns["obs"][slot].tobytes() + rb._columns["action"][slot].tobytes()
            out.append((row, float(rb.priorities(np.array([slot]))[0]), w - 1 - last, node, r))
    return out


def _resplit(paths, new_buffers, frames=None):
    shards = [open_shard(p) for p in paths]
    try:
        plan = plan_resplit([[r.rows for r in s.rings] for s in shards],
                            [list(rb._ring_bounds()[1]) for rb in new_buffers], frames)
        got = [load_resplit(rb, pieces, shards, 0) for rb, pieces in zip(new_buffers, plan.rings)]
    finally:
        for s in shards:
            s.close()
    return plan, got


OLD_PLAIN = [(300, 2, (700, 120)), (300, 3, (40, 500, 100))]   # wrapped and partly filled


@pytest.mark.parametrize("new", [
    [(320, 1)],                      # one node, smaller: the oldest rows go
    [(300, 2), (300, 1), (300, 1)],  # three nodes, all of it fits
    [(300, 2), (300, 3)],            # the same layout, through the re-split
    [(97, 4), (50, 1)],              # uneven regions, much smaller
])
def test_plain_rows_come_back_once_with_their_priority(tmp_path, new):
    old = [_filled_plain(c, r, fills, seed) for seed, (c, r, fills) in enumerate(OLD_PLAIN)]
    saved = [row for node, rb in enumerate(old) for row in _held_rows(rb, node)]
    paths = _save(tmp_path, old)
    buffers = [SharedReplay(SPEC, c, regions=r) for c, r in new]
    plan, got = _resplit(paths, buffers)

    room = sum(c for c, _ in new)
    newest = sorted(saved, key=lambda x: (x[2], x[3], x[4]))[:room]
    want = Counter((row, prio) for row, prio, *_ in newest)
    have = Counter((row, prio) for node, rb in enumerate(buffers)
                   for row, prio, *_ in _held_rows(rb, node))
    assert have == want
    assert plan.saved_rows == len(saved) and plan.kept_rows == sum(want.values())
    assert sum(g["rows"] for g in got) == plan.kept_rows
    union_max = max(rb.max_priority() for rb in old)
    ages = {(row, prio): age for row, prio, age, *_ in saved}
    for rb in buffers:
        assert rb.max_priority() == union_max
        leaves = rb.priorities(np.arange(rb.capacity)).astype(np.float64)
        assert rb.total() == pytest.approx(leaves.sum(), rel=1e-6)
        for r in range(rb.regions):          # each ring holds its rows oldest first
            a, b = rb.region_slots(r)
            held = [(rb._columns["obs"][s].tobytes() + rb._columns["action"][s].tobytes(),
                     float(rb.priorities(np.array([s]))[0])) for s in range(a, a + rb.writes(r))]
            seq = [ages[h] for h in held]
            assert seq == sorted(seq, reverse=True), (r, seq)
        if rb.size():
            s = rb.sample(64)                # samples, and new rows go in after the old
            assert s["weights"].max() <= 1
            rb.add(0, {"obs": np.zeros((2, 3), np.float32), "action": np.zeros(2, np.int64)})


def test_two_loads_of_one_checkpoint_are_identical(tmp_path):
    old = [_filled_plain(c, r, fills, seed) for seed, (c, r, fills) in enumerate(OLD_PLAIN)]
    paths = _save(tmp_path, old)
    first = [SharedReplay(SPEC, 200, regions=2), SharedReplay(SPEC, 200, regions=1)]
    second = [SharedReplay(SPEC, 200, regions=2), SharedReplay(SPEC, 200, regions=1)]
    _resplit(paths, first)
    _resplit(paths, second)
    for a, b in zip(first, second):
        assert np.array_equal(a.state_bytes(), b.state_bytes())


def test_a_damaged_shard_is_refused_naming_its_file(tmp_path):
    old = [_filled_plain(300, 2, (700, 120), 0)]
    (path,) = _save(tmp_path, old)
    with h5py.File(path, "r+") as f:
        rows = f["replay/region_rows"][()]
        rows[1] -= 1
        f["replay/region_rows"][...] = rows
    with pytest.raises(ShardError, match=path.name):
        open_shard(path)
    with h5py.File(path, "r+") as f:
        del f["replay/column.action"]
    with pytest.raises(ShardError, match=path.name):
        open_shard(path)


def test_a_shard_of_other_fields_is_refused(tmp_path):
    (path,) = _save(tmp_path, [_filled_plain(300, 2, (700, 120), 0)])
    other = SharedReplay({"obs": ((4,), np.float32), "action": ((), np.int64)}, 300)
    with pytest.raises(ShardError, match="spec"):
        _resplit([path], [other])
    assert other.size() == 0


# -- frame replays ----------------------------------------------------------------------

def _filled_frames(capacity, regions, streams, steps, node):
    rb = FrameStackReplay(FSPEC, capacity, regions=regions, streams=streams, n_step=N_STEP)
    writers = [Streams(rb, r, [stamp_env(100 * node + 10 * r + i) for i in range(streams)],
                       N_STEP, seed=7 * node + r) for r in range(regions)]
    for t in range(steps):
        for w in writers:
            w.step()
        if t % 5 == 4:
            for w in writers:
                w.flush()
    for w in writers:
        w.flush()
    rng = np.random.default_rng(node)
    s = rb.sample(32, rng=rng)
    rb.update_priorities(s["indices"], rng.random(32) * 4, s["tickets"])
    by_slot = {}
    for w in writers:
        by_slot.update(w.by_slot)
    return rb, by_slot


def _key(obs, action, ret, next_obs, disc, prio):
    return (np.asarray(obs).tobytes(), int(action), float(np.float32(ret)),
            np.asarray(next_obs).tobytes(), float(np.float32(disc)), float(prio))


def _saved_transitions(rb, by_slot) -> Counter:
    """The environment's own transitions of every samplable slot, with its priority."""
    prio = rb.priorities(np.arange(rb.capacity))
    return Counter(_key(*by_slot[s], prio[s]) for s in np.flatnonzero(prio > 0).tolist())


def _samplable(rb) -> Counter:
    """What the buffer's own gather returns for every slot with a priority."""
    slots = np.flatnonzero(rb.priorities(np.arange(rb.capacity)) > 0)
    got = rb._gather(rb._core, slots)
    assert got["ok"].all()                   # every one a whole, current window
    return Counter(_key(got["obs"][i], got["action"][i], got["reward"][i],
                        got["next_obs"][i], got["discount"][i], got["prio"][i])
                   for i in range(slots.size))


OLD_FRAMES = [(240, 2, 2, 40), (240, 2, 2, 95)]    # node 1's streams have wrapped


@pytest.mark.parametrize("new, fits", [
    ([(240, 1, 2)], False),                       # 1 node x 1 actor: half the room
    ([(240, 1, 2), (240, 1, 2), (240, 1, 2)], True),   # 3 nodes: it all fits
    ([(240, 2, 2), (240, 2, 2)], True),           # the saved layout
    ([(120, 1, 3)], False),                       # more envs, shorter streams: cuts
    ([(600, 1, 1)], True),                        # one long stream takes every stream
])
def test_frame_stacks_and_successors_stay_what_was_emitted(tmp_path, new, fits):
    old, saved = [], Counter()
    for node, (c, r, e, steps) in enumerate(OLD_FRAMES):
        rb, by_slot = _filled_frames(c, r, e, steps, node)
        saved += _saved_transitions(rb, by_slot)
        old.append(rb)
    paths = _save(tmp_path, old)
    buffers = [FrameStackReplay(FSPEC, c, regions=r, streams=e, n_step=N_STEP)
               for c, r, e in new]
    plan, got = _resplit(paths, buffers, (STACK, N_STEP))
    have = sum((_samplable(rb) for rb in buffers), Counter())
    assert not have - saved                    # nothing that was not saved, nothing twice
    assert (have == saved) is fits, (sum(have.values()), sum(saved.values()))
    assert sum(g["transitions"] for g in got) == sum(have.values())
    if not fits:
        assert plan.kept_rows < plan.saved_rows and sum(have.values()) > 0

    # New episodes overwrite the loaded rows: every sample stays a true transition.
    rng = np.random.default_rng(5)
    for rb in buffers:
        writers = [Streams(rb, r, [stamp_env(200 + 10 * r + i) for i in range(rb.streams)],
                           N_STEP, seed=50 + r) for r in range(rb.regions)]
        for t in range(60):
            for w in writers:
                w.step()
            for w in writers:
                w.flush()
            fresh = {}
            for w in writers:
                fresh.update(w.by_slot)
            s = rb.sample(32, rng=rng)
            mine = np.isin(s["indices"], list(fresh))
            assert not check_sample({k: v[mine] for k, v in s.items()}, fresh)
            for b in np.flatnonzero(~mine):
                key = _key(s["obs"][b], s["action"][b], s["reward"][b], s["next_obs"][b],
                           s["discount"][b], 0.0)[:5]
                assert any(k[:5] == key for k in saved), "a loaded row changed"
