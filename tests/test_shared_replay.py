"""SharedReplay in private memory (comm=None): storage, rings, priorities, sampling, errors."""

import math

import numpy as np
import pytest

from pal_hpc.replay import KSumTree, SharedReplay

CARTPOLE = {"obs": ((4,), np.float32), "action": ((), np.int64),
            "reward": ((), np.float32), "done": ((), np.bool_)}
FRAMES = {"frame": ((84, 84, 4), np.uint8), "action": ((), np.int64)}
EXTRAS = {"indices", "weights", "tickets"}


def make_batch(spec, n, rng):
    """Random rows of every field; int fields are unique so rows are told apart."""
    out = {}
    for name, (shape, dtype) in spec.items():
        dt = np.dtype(dtype)
        if dt == np.bool_:
            out[name] = rng.random((n, *shape)) < 0.5
        elif dt.kind == "f":
            out[name] = rng.standard_normal((n, *shape)).astype(dt)
        elif dt == np.uint8:
            out[name] = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
        else:
            out[name] = rng.integers(0, 2**40, (n, *shape)).astype(dt)
    return out


class Shadow:
    """What the buffer must hold: a numpy copy of every slot written so far."""

    def __init__(self, spec, capacity):
        self.cols = {k: np.zeros((capacity, *s), d) for k, (s, d) in spec.items()}
        self.written = np.zeros(capacity, bool)

    def add(self, rb, region, batch):
        idx = rb.add(region, batch)
        assert idx.dtype == np.int64 and idx.shape == (len(next(iter(batch.values()))),)
        for k, v in batch.items():
            self.cols[k][idx] = v
        self.written[idx] = True
        return idx


def check_sample(s, spec, shadow, batch_size):
    assert set(s) == set(spec) | EXTRAS
    idx = s["indices"]
    assert idx.dtype == np.int64 and idx.shape == (batch_size,)
    assert s["weights"].dtype == np.float32 and s["tickets"].dtype == np.uint64
    assert shadow.written[idx].all(), "sampled a never-written slot"
    for name, (shape, dtype) in spec.items():
        assert s[name].dtype == np.dtype(dtype) and s[name].shape == (batch_size, *shape), name
        np.testing.assert_array_equal(s[name], shadow.cols[name][idx], err_msg=name)


def ticket_map(rb, rng):
    """A current ticket for every written slot, found by sampling (a ticket only
    changes when its slot is rewritten, not when its priority is updated)."""
    tickets = {}
    for _ in range(200):
        s = rb.sample(512, rng=rng)
        tickets.update(zip(s["indices"].tolist(), s["tickets"].tolist()))
        if len(tickets) == rb.size():
            break
    assert len(tickets) == rb.size()
    idx = np.array(sorted(tickets), np.int64)
    return idx, np.array([tickets[i] for i in idx.tolist()], np.uint64)


def fill_every_region(rb, shadow, spec, rng):
    for r in range(rb.regions):
        lo, hi = rb.region_slots(r)
        shadow.add(rb, r, make_batch(spec, hi - lo, rng))


def filled(spec, capacity, regions, rng, **kw):
    rb, shadow = SharedReplay(spec, capacity, regions=regions, **kw), Shadow(spec, capacity)
    fill_every_region(rb, shadow, spec, rng)
    return rb, shadow


@pytest.mark.parametrize("spec,capacity,regions", [(CARTPOLE, 100, 1), (CARTPOLE, 103, 3),
                                                   (FRAMES, 16, 2)])
def test_add_sample_round_trip(spec, capacity, regions):
    rng = np.random.default_rng(capacity)
    with SharedReplay(spec, capacity, regions=regions) as rb:
        assert rb.capacity == capacity and rb.regions == regions
        bounds = [rb.region_slots(r) for r in range(regions)]     # a partition, in order
        assert bounds[0][0] == 0 and bounds[-1][1] == capacity
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(bounds, bounds[1:] + [(capacity,)]))
        assert rb.bytes_per_transition >= sum(np.dtype(d).itemsize * math.prod(s)
                                              for s, d in spec.values())
        shadow = Shadow(spec, capacity)
        for step in range(4 * regions):
            r = step % regions
            lo, hi = rb.region_slots(r)
            shadow.add(rb, r, make_batch(spec, int(rng.integers(1, hi - lo + 1)), rng))
            check_sample(s := rb.sample(64, rng=rng), spec, shadow, 64)
        # The sample is a copy: rewriting every slot leaves it as it was.
        before = {k: v.copy() for k, v in s.items()}
        fill_every_region(rb, shadow, spec, rng)
        for k in before:
            np.testing.assert_array_equal(s[k], before[k], err_msg=k)
        check_sample(rb.sample(64, rng=rng), spec, shadow, 64)


def test_ring_overwrite_order_and_bookkeeping():
    rng = np.random.default_rng(1)
    rb, shadow = SharedReplay(CARTPOLE, 40, regions=2), Shadow(CARTPOLE, 40)
    (lo, hi), seq = rb.region_slots(1), 0
    length = hi - lo
    for n in [7, length, 3, length - 1, 1, 5]:
        idx = shadow.add(rb, 1, make_batch(CARTPOLE, n, rng))
        np.testing.assert_array_equal(idx, lo + (seq + np.arange(n)) % length)
        seq += n
        assert rb.writes(1) == seq and rb.writes(0) == 0
        assert rb.size() == min(seq, length)
    s = rb.sample(256, rng=rng)
    assert ((s["indices"] >= lo) & (s["indices"] < hi)).all()   # region 0 is empty
    check_sample(s, CARTPOLE, shadow, 256)
    lo0, hi0 = rb.region_slots(0)
    shadow.add(rb, 0, make_batch(CARTPOLE, 4, rng))
    assert rb.writes(0) == 4 and rb.size() == length + 4
    check_sample(rb.sample(256, rng=rng), CARTPOLE, shadow, 256)
    np.testing.assert_array_equal(rb.priorities(np.arange(lo0 + 4, hi0)), 0)
    rb.close()


def test_new_data_gets_max_priority_seen():
    rng = np.random.default_rng(2)
    rb, shadow = SharedReplay(CARTPOLE, 30, regions=1, alpha=0.6, eps=1e-6), Shadow(CARTPOLE, 30)
    first = shadow.add(rb, 0, make_batch(CARTPOLE, 10, rng))
    p0 = rb.priorities(first)
    assert p0.dtype == np.float32 and (p0 > 0).all() and (p0 == p0[0]).all()
    idx, tk = ticket_map(rb, rng)
    raw = np.full(10, 0.5)
    raw[3] = 50.0
    assert rb.update_priorities(idx, raw, tk) == 10
    top = max(float(p0[0]), float(np.float32((50.0 + 1e-6) ** 0.6)))
    new = shadow.add(rb, 0, make_batch(CARTPOLE, 5, rng))
    np.testing.assert_allclose(rb.priorities(new), top, rtol=1e-6)
    # Lowering the top priority does not lower what new data gets: max *seen*.
    assert rb.update_priorities(idx[3:4], [0.01], tk[3:4]) == 1
    newer = shadow.add(rb, 0, make_batch(CARTPOLE, 5, rng))
    np.testing.assert_allclose(rb.priorities(newer), top, rtol=1e-6)


@pytest.mark.parametrize("alpha,eps", [(0.6, 1e-6), (0.5, 0.01), (1.0, 1e-3)])
def test_update_stores_p_plus_eps_to_alpha(alpha, eps):
    rng = np.random.default_rng(3)
    rb, _ = filled(CARTPOLE, 50, 2, rng, alpha=alpha, eps=eps)
    idx, tk = ticket_map(rb, rng)
    raw = rng.random(idx.size) * 10 + 0.01
    assert rb.update_priorities(idx, raw, tk) == idx.size
    np.testing.assert_allclose(rb.priorities(idx), ((raw + eps) ** alpha).astype(np.float32),
                               rtol=1e-6)


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_weights_match_formula(beta):
    rng = np.random.default_rng(4)
    rb, _ = filled(CARTPOLE, 60, 3, rng)
    idx, tk = ticket_map(rb, rng)
    rb.update_priorities(idx, rng.random(idx.size) * 5 + 0.05, tk)
    p = rb.priorities(np.arange(60)).astype(np.float64)
    p_min = p[p > 0].min()
    s = rb.sample(500, beta=beta, rng=rng)
    expected = (p[s["indices"]] / p_min) ** -beta
    np.testing.assert_allclose(s["weights"], expected, rtol=1e-5)
    assert s["weights"].max() <= 1.0


def distinct_sample(rb, n, rng):
    s = rb.sample(n, rng=rng)
    idx, first = np.unique(s["indices"], return_index=True)
    return idx, s["tickets"][first]


def test_ticket_mismatch_drops_update():
    rng = np.random.default_rng(5)
    rb, shadow = filled(CARTPOLE, 20, 1, rng)
    idx, tk = distinct_sample(rb, 8, rng)
    shadow.add(rb, 0, make_batch(CARTPOLE, 20, rng))       # every slot rewritten
    before = rb.priorities(idx)
    assert rb.update_priorities(idx, np.full(idx.size, 9.0), tk) == 0
    np.testing.assert_array_equal(rb.priorities(idx), before)
    # Fresh tickets apply; then rewriting only some slots drops exactly those.
    idx, tk = distinct_sample(rb, 64, rng)
    rewritten = shadow.add(rb, 0, make_batch(CARTPOLE, 7, rng))
    stale = np.isin(idx, rewritten)
    before = rb.priorities(idx)
    raw = rng.random(idx.size) + 0.1
    assert rb.update_priorities(idx, raw, tk) == int((~stale).sum())
    after = rb.priorities(idx)
    np.testing.assert_array_equal(after[stale], before[stale])
    np.testing.assert_allclose(after[~stale], ((raw[~stale] + 1e-6) ** 0.6), rtol=1e-6)


def test_total_is_exact_sum_of_leaves():
    rng, cap = np.random.default_rng(6), 5000
    rb, shadow = filled(CARTPOLE, cap, 4, rng)
    for step in range(300):
        if step % 50 == 0:
            lo, hi = rb.region_slots(step // 50 % 4)
            shadow.add(rb, step // 50 % 4, make_batch(CARTPOLE, hi - lo, rng))
        s = rb.sample(256, rng=rng)
        raw = rng.random(256) * 10.0 ** rng.integers(-4, 3, 256)
        rb.update_priorities(s["indices"], raw, s["tickets"])
    exact = math.fsum(rb.priorities(np.arange(cap)).astype(np.float64))
    assert rb.total() == pytest.approx(exact, rel=1e-5)


def chi_square_critical(dof, z=3.719):
    """Upper critical value of chi-square (Wilson-Hilferty), z=3.719 -> p = 1e-4."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


@pytest.mark.parametrize("fanout", [2, 16])
def test_sampling_matches_p_alpha_chi_square(fanout):
    rng, cap = np.random.default_rng(7 + fanout), 300
    rb, _ = filled({"x": ((), np.int64)}, cap, 3, rng, fanout=fanout, alpha=0.6)
    idx, tk = ticket_map(rb, rng)
    raw = rng.random(cap) * 3 + 0.05
    assert rb.update_priorities(idx, raw, tk) == cap
    expected = ((raw + 1e-6) ** 0.6).astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(rb.priorities(idx), expected, rtol=1e-6)
    n = 300_000
    drawn = np.concatenate([rb.sample(1000, rng=rng)["indices"] for _ in range(n // 1000)])
    counts = np.bincount(drawn, minlength=cap)
    exp = expected / expected.sum() * n
    stat = float(((counts - exp) ** 2 / exp).sum())
    assert stat < chi_square_critical(cap - 1), stat


# -- bad input: rejected, naming the field, with the buffer left exactly as it was --

def snapshot(rb):
    s = rb.sample(512, rng=np.random.default_rng(99))
    return (rb.size(), rb.total(), [rb.writes(r) for r in range(rb.regions)],
            rb.priorities(np.arange(rb.capacity)), s)


def assert_unchanged(rb, snap):
    size, total, writes, prio, s = snapshot(rb)
    assert (size, total, writes) == snap[:3]
    np.testing.assert_array_equal(prio, snap[3])
    for k in s:
        np.testing.assert_array_equal(s[k], snap[4][k], err_msg=k)


BAD_BATCHES = {
    "missing": (lambda b: {k: v for k, v in b.items() if k != "reward"}, "reward"),
    "extra": (lambda b: {**b, "bonus": np.zeros(3, np.float32)}, "bonus"),
    "obs_shape": (lambda b: {**b, "obs": np.zeros((3, 5), np.float32)}, "obs"),
    "scalar_shape": (lambda b: {**b, "action": np.zeros((3, 1), np.int64)}, "action"),
    "obs_dtype": (lambda b: {**b, "obs": b["obs"].astype(np.float64)}, "obs"),
    "action_dtype": (lambda b: {**b, "action": b["action"].astype(np.int32)}, "action"),
    "done_dtype": (lambda b: {**b, "done": b["done"].astype(np.uint8)}, "done"),
    "ragged": (lambda b: {**b, "reward": np.zeros(4, np.float32)}, None),
}


@pytest.fixture
def busy():
    rng = np.random.default_rng(8)
    rb, _ = filled(CARTPOLE, 20, 2, rng)
    idx, tk = ticket_map(rb, rng)
    rb.update_priorities(idx, rng.random(idx.size) + 0.1, tk)
    yield rb, rng, snapshot(rb)
    rb.close()


@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_bad_batch_rejected_unchanged(busy, case):
    rb, rng, snap = busy
    corrupt, field = BAD_BATCHES[case]
    with pytest.raises(ValueError, match=field):
        rb.add(0, corrupt(make_batch(CARTPOLE, 3, rng)))
    assert_unchanged(rb, snap)


def test_bad_batch_size_or_region_rejected_unchanged(busy):
    rb, rng, snap = busy
    lo, hi = rb.region_slots(1)
    for n in (hi - lo + 1, 0):
        with pytest.raises(ValueError):
            rb.add(1, make_batch(CARTPOLE, n, rng))
    for region in (rb.regions, rb.regions + 5, -1):
        with pytest.raises(IndexError):
            rb.add(region, make_batch(CARTPOLE, 2, rng))
    assert_unchanged(rb, snap)


@pytest.mark.parametrize("bad", [math.nan, -1.0, math.inf])
def test_bad_priority_rejected_unchanged(busy, bad):
    rb, rng, snap = busy
    s = rb.sample(6, rng=rng)
    raw = np.array([0.5, 1.0, bad, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError):
        rb.update_priorities(s["indices"], raw, s["tickets"])
    assert_unchanged(rb, snap)


@pytest.mark.parametrize("eps", [0.0, -1e-6, math.nan])
def test_eps_must_be_positive(eps):
    """eps > 0 keeps every written slot samplable (eps = 0 could leave nothing to sample)."""
    with pytest.raises(ValueError, match="eps"):
        SharedReplay(CARTPOLE, 8, eps=eps)


def test_empty_slots_are_never_sampled_nor_updated():
    """Nothing to sample before the first write; and since no sample hands out a
    ticket for an empty slot, no priority update may fill one."""
    rb = SharedReplay(CARTPOLE, 8, regions=1)
    with pytest.raises(ValueError):
        rb.sample(4)
    rb.add(0, make_batch(CARTPOLE, 2, np.random.default_rng(0)))
    total = rb.total()
    try:
        applied = rb.update_priorities(np.array([5]), np.array([100.0]), np.zeros(1, np.uint64))
    except ValueError:
        applied = 0
    assert applied == 0 and rb.priorities([5])[0] == 0 and rb.total() == total
    assert set(rb.sample(64, rng=0)["indices"].tolist()) <= {0, 1}
    rb.close()



def test_sample_is_with_replacement_and_refuses_an_empty_buffer():
    """Stratified draws are with replacement: batch_size > size() gives batch_size
    rows, all written; with equal priorities each slot fills batch/size strata."""
    rb = SharedReplay(CARTPOLE, 64, regions=2)
    with pytest.raises(ValueError, match="no transitions"):
        rb.sample(8)
    shadow = Shadow(CARTPOLE, 64)
    written = shadow.add(rb, 1, make_batch(CARTPOLE, 5, np.random.default_rng(0)))
    s = rb.sample(40, rng=1)
    check_sample(s, CARTPOLE, shadow, 40)
    counts = np.bincount(s["indices"], minlength=64)
    assert counts.sum() == 40 and set(np.flatnonzero(counts)) == set(written.tolist())
    assert (np.abs(counts[written] - 8) <= 1).all(), counts[written]
    rb.close()


# -- sizes: exact before allocating, refused cleanly when too large -----------------

@pytest.mark.parametrize("spec,capacity,regions,fanout", [
    (CARTPOLE, 1, 1, 16), (CARTPOLE, 103, 3, 2), (FRAMES, 16, 2, 4),
    ({"x": ((0,), np.float32), "y": ((3, 5), np.float64)}, 1000, 7, 64)])
def test_window_nbytes_is_what_the_constructor_allocates(spec, capacity, regions, fanout):
    need = SharedReplay.window_nbytes(spec, capacity, regions=regions, fanout=fanout)
    with SharedReplay(spec, capacity, regions=regions, fanout=fanout) as rb:
        assert need == rb.nbytes == rb.state_bytes().size


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(capacity=0), ValueError, "capacity"), (dict(capacity=2.0), TypeError, "capacity"),
    (dict(regions=11), ValueError, "regions"), (dict(fanout=3), ValueError, "fanout"),
    (dict(spec={}), ValueError, "spec")])
def test_window_nbytes_validates_like_the_constructor(kwargs, exc, match):
    args = dict(spec=CARTPOLE, capacity=10, regions=1, fanout=16) | kwargs
    with pytest.raises(exc, match=match):
        SharedReplay.window_nbytes(**args)
    with pytest.raises(exc, match=match):
        SharedReplay(**args)


def test_huge_buffers_are_refused_before_allocating():
    """10**17 slots is a well-formed size no machine holds: MemoryError, no attempt.
    Sizes past what int64 offsets can address are a ValueError naming the size."""
    cap = 10**17
    need = SharedReplay.window_nbytes(CARTPOLE, cap)
    row = 16 + 8 + 4 + 1 + 8                                   # fields + seq counter
    assert 0 <= need - KSumTree.nbytes(cap) - row * cap < 4096
    with pytest.raises(MemoryError, match=str(need)):
        SharedReplay(CARTPOLE, cap)
    with pytest.raises(MemoryError):
        SharedReplay(CARTPOLE, 2**40, regions=2**40)           # a huge control block
    for args in [dict(spec=CARTPOLE, capacity=10**18),
                 dict(spec={"x": ((2**40, 2**40), np.uint8)}, capacity=10),
                 dict(spec=CARTPOLE, capacity=2**60, fanout=2)]:
        with pytest.raises(ValueError, match="too large|more than"):
            SharedReplay.window_nbytes(**args)
        with pytest.raises(ValueError, match="too large|more than"):
            SharedReplay(**args)
