"""KSumTree against the numpy reference, and the sampling distribution."""

import contextlib
import math
import os
import time

import numpy as np
import pytest

from pal_hpc.replay import KSumTree, ReferenceSumTree, aligned_empty

FANOUTS = [2, 4, 8, 16, 64]


def capacities(k):
    return sorted({1, max(1, k - 1), k + 1, 1000, 2**20 + 3})


def random_priorities(rng, n, zero_fraction=0.2):
    """Priorities spanning several decades, with exact zeros mixed in."""
    p = rng.random(n) * 10.0 ** rng.integers(-3, 3, n)
    p[rng.random(n) < zero_fraction] = 0.0
    return p


def assert_same(tree, ref, rng, n_masses=4000):
    cap = tree.capacity
    assert tree.capacity == ref.capacity
    np.testing.assert_array_equal(tree.get(np.arange(cap)), ref.get(np.arange(cap)))
    assert tree.total() == pytest.approx(ref.total(), rel=1e-12, abs=1e-300)
    assert tree.min() == ref.min()
    if ref.total() > 0:
        masses = rng.random(n_masses) * ref.total()
        np.testing.assert_array_equal(tree.find(masses), ref.find(masses))
        np.testing.assert_array_equal(tree.sample(257, rng=7), ref.sample(257, rng=7))


@pytest.mark.parametrize("fanout", FANOUTS)
def test_matches_reference(fanout):
    rng = np.random.default_rng(fanout)
    for cap in capacities(fanout):
        tree, ref = KSumTree(cap, fanout), ReferenceSumTree(cap, fanout)
        assert tree.total() == 0.0 and tree.min() == 0.0
        batches = 6 if cap < 2**20 else 3
        for _ in range(batches):
            n = int(rng.integers(1, min(cap, 5000) + 1))
            idx = rng.integers(0, cap, n)          # repeats included
            p = random_priorities(rng, n)
            tree.update(idx, p)
            ref.update(idx, p)
            assert_same(tree, ref, rng)
        # Fill everything once, then empty a whole region back to zero.
        if cap <= 5000:
            p = random_priorities(rng, cap)
            tree.update(np.arange(cap), p)
            ref.update(np.arange(cap), p)
            assert_same(tree, ref, rng)
            tree.update(np.arange(cap // 2), 0.0)
            ref.update(np.arange(cap // 2), 0.0)
            assert_same(tree, ref, rng)


def test_last_occurrence_wins():
    tree = KSumTree(10, 4)
    tree.update([3, 5, 3, 3, 5], [1.0, 2.0, 7.0, 4.0, 9.0])
    assert tree.get(3) == 4.0 and tree.get(5) == 9.0
    assert tree.total() == 13.0


def test_scalars_and_broadcast():
    tree = KSumTree(100)
    tree.update(7, 2.5)
    assert tree.get(7) == 2.5
    assert isinstance(tree.get(7), float)
    tree.update([1, 2, 3], 0.5)
    np.testing.assert_array_equal(tree.get([1, 2, 3]), np.full(3, 0.5, np.float32))
    assert tree.find(0.0) == 1
    assert isinstance(tree.find(0.0), int)
    assert tree.total() == 4.0 and tree.min() == 0.5
    assert len(tree) == 100 and tree.capacity == 100 and tree.fanout == 16


def test_min_tracks_removals():
    tree = KSumTree(1000, 8)
    tree.update(np.arange(1000), np.arange(1000) + 1.0)
    assert tree.min() == 1.0
    tree.update(0, 0.0)              # the minimum leaves: next one up
    assert tree.min() == 2.0
    tree.update(999, 0.25)           # a new minimum elsewhere
    assert tree.min() == 0.25
    tree.update(np.arange(1000), 0.0)
    assert tree.min() == 0.0 and tree.total() == 0.0


def test_zero_leaves_never_sampled():
    rng = np.random.default_rng(1)
    cap = 5000
    p = rng.random(cap)
    p[rng.random(cap) < 0.7] = 0.0
    tree = KSumTree(cap, 16)
    tree.update(np.arange(cap), p)
    drawn = np.concatenate([tree.sample(1024, rng) for _ in range(50)])
    assert np.all(p[drawn] > 0)
    # Boundary masses: 0, exactly the total, and just below it.
    edges = tree.find([0.0, tree.total(), np.nextafter(tree.total(), 0), tree.total() * 2])
    assert np.all(p[edges] > 0)
    assert edges[1] == edges[3] == np.flatnonzero(p)[-1]
    assert edges[0] == np.flatnonzero(p)[0]


def test_sampling_all_zero_raises():
    tree = KSumTree(64)
    with pytest.raises(ValueError, match="zero"):
        tree.sample(4, 0)
    tree.update(np.arange(64), 1.0)
    tree.update(np.arange(64), 0.0)
    with pytest.raises(ValueError, match="zero"):
        tree.sample(4, 0)
    with pytest.raises(ValueError, match="zero"):
        tree.find([0.5])


def chi_square_critical(dof, z=3.719):
    """Upper critical value of chi-square (Wilson-Hilferty), z=3.719 -> p = 1e-4."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


@pytest.mark.parametrize("fanout", [2, 16, 64])
def test_sampling_distribution_chi_square(fanout):
    rng = np.random.default_rng(100 + fanout)
    cap = 300
    p = rng.random(cap) ** 2 + 0.01
    p[rng.random(cap) < 0.1] = 0.0
    tree = KSumTree(cap, fanout)
    tree.update(np.arange(cap), p)
    expected_p = p.astype(np.float32).astype(np.float64)
    expected_p /= expected_p.sum()
    positive = expected_p > 0
    # i.i.d. masses through find() and stratified sample() must both match p / sum.
    n = 300_000
    for drawn in (tree.find(rng.random(n) * tree.total()),
                  np.concatenate([tree.sample(1000, rng) for _ in range(n // 1000)])):
        counts = np.bincount(drawn, minlength=cap)
        assert counts[~positive].sum() == 0
        exp = expected_p[positive] * n
        stat = float(((counts[positive] - exp) ** 2 / exp).sum())
        dof = int(positive.sum()) - 1
        assert stat < chi_square_critical(dof), (stat, dof)


def test_chi_square_detects_a_wrong_distribution():
    """The test above can fail: a uniform sampler does not pass it."""
    rng = np.random.default_rng(3)
    cap = 300
    p = rng.random(cap) ** 2 + 0.01
    expected = p / p.sum() * 300_000
    counts = np.bincount(rng.integers(0, cap, 300_000), minlength=cap)
    stat = float(((counts - expected) ** 2 / expected).sum())
    assert stat > chi_square_critical(cap - 1)


def test_thread_count_does_not_change_results():
    rng = np.random.default_rng(5)
    cap = 2**18 + 11
    tree = KSumTree(cap, 16)
    tree.update(np.arange(cap), random_priorities(rng, cap))
    masses = rng.random(200_000) * tree.total()
    idx = rng.integers(0, cap, 200_000)
    results = []
    for threads in (1, 2, 4):
        tree.num_threads = threads
        results.append((tree.find(masses), tree.sample(100_000, rng=11), tree.get(idx)))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


def test_layout_is_cache_aligned():
    for fanout in FANOUTS:
        for cap in capacities(fanout):
            parts = KSumTree.layout(cap, fanout)
            assert parts[0]["nodes"] >= cap
            for part in parts:
                group = fanout * part["itemsize"]
                assert part["offset"] % 64 == 0, part
                assert part["nodes"] == 1 or part["nodes"] % fanout == 0, part
                # A group of siblings never straddles a 64-byte line when it fits in
                # one, and starts on a line when it does not.
                assert (part["offset"] % min(group, 64)) == 0
            ends = [p["offset"] + p["nodes"] * p["itemsize"] for p in parts]
            assert max(ends) <= KSumTree.nbytes(cap, fanout)
    # K=16 float32 leaves: one group is exactly one cache line.
    assert 16 * KSumTree.layout(1 << 20, 16)[0]["itemsize"] == 64


def test_attach_sees_the_same_tree():
    cap, k = 5000, 16
    buf = aligned_empty(KSumTree.nbytes(cap, k))
    a = KSumTree(cap, k, buffer=buf)
    b = KSumTree.attach(buf, cap, k)
    a.update([1, 2, 3], [1.0, 2.0, 3.0])
    assert b.total() == 6.0 and b.get(2) == 2.0
    b.update(2, 0.0)
    assert a.total() == 4.0 and a.min() == 1.0
    assert b.buffer.ctypes.data == buf.ctypes.data
    # A second tree initialised over the same buffer starts again from zero.
    KSumTree(cap, k, buffer=buf)
    assert a.total() == 0.0


@contextlib.contextmanager
def shared_tree(cap, k):
    """A fresh KSumTree in a named shared-memory block; yields (tree, name, offset, nbytes)
    so a forked child can attach to the same memory."""
    from multiprocessing import shared_memory

    nbytes = KSumTree.nbytes(cap, k)
    shm = shared_memory.SharedMemory(create=True, size=nbytes + 64)
    try:
        raw = np.ndarray((nbytes + 64,), np.uint8, buffer=shm.buf)
        offset = (-raw.ctypes.data) % 64
        tree = KSumTree(cap, k, buffer=raw[offset:offset + nbytes])
        yield tree, shm.name, offset, nbytes
        del raw, tree
    finally:
        shm.close()
        shm.unlink()


def attach_in_child(name, offset, nbytes, cap, k):
    """The child's side of `shared_tree`: (tree, shm) -- close shm when done."""
    from multiprocessing import shared_memory
    shm = shared_memory.SharedMemory(name=name)
    raw = np.ndarray((nbytes + 64,), np.uint8, buffer=shm.buf)
    return KSumTree.attach(raw[offset:offset + nbytes], cap, k), shm


def test_attach_across_processes():
    """A tree in shared memory, updated by a forked child, read by the parent."""
    import multiprocessing as mp

    cap, k = 10_000, 16
    with shared_tree(cap, k) as (tree, name, offset, nbytes):
        proc = mp.get_context("fork").Process(target=_child_updates,
                                              args=(name, offset, nbytes, cap, k))
        proc.start()
        proc.join(60)
        assert proc.exitcode == 0
        expected = np.zeros(cap)
        expected[np.arange(0, cap, 7)] = np.arange(0, cap, 7) * 0.5
        assert tree.total() == pytest.approx(expected.sum(), rel=1e-12)
        np.testing.assert_array_equal(tree.get(np.arange(cap)), expected.astype(np.float32))


def _child_updates(name, offset, nbytes, cap, k):
    tree, shm = attach_in_child(name, offset, nbytes, cap, k)
    idx = np.arange(0, cap, 7)
    tree.update(idx, idx * 0.5)
    del tree
    shm.close()


def test_reference_matches_brute_force():
    """The oracle itself: find() equals a cumulative-sum search."""
    rng = np.random.default_rng(9)
    for k in (2, 16):
        ref = ReferenceSumTree(777, k)
        p = random_priorities(rng, 777, 0.3).astype(np.float32)
        ref.update(np.arange(777), p)
        cum = np.cumsum(p.astype(np.float64))
        masses = rng.random(5000) * cum[-1]
        expect = np.searchsorted(cum, masses, side="right")
        got = ref.find(masses)
        # Both pick the leaf whose interval holds the mass; they can differ only
        # where a mass sits within rounding of an interval edge.
        differ = got != expect
        assert differ.sum() <= 2
        assert np.all(p[got] > 0)


@pytest.mark.parametrize("cap", [507, 70_001])
def test_sampling_while_another_process_updates(cap):
    """One writer (a forked process) updates a shared tree while this process samples:
    the descent reads half-applied updates, yet every index it returns is a real leaf
    (capacities with padding: a torn group once led a descent into a padding node)."""
    import multiprocessing as mp

    k = 16
    with shared_tree(cap, k) as (tree, name, offset, nbytes):
        tree.update(np.arange(cap), 1.0)
        ctx = mp.get_context("fork")
        stop = ctx.Event()
        proc = ctx.Process(target=_child_hammers, args=(name, offset, nbytes, cap, k, stop))
        proc.start()
        try:
            rng = np.random.default_rng(0)
            deadline = time.monotonic() + 1.5
            draws = 0
            while time.monotonic() < deadline:
                try:
                    idx = tree.sample(512, rng)
                except ValueError:      # every priority momentarily zero: allowed
                    continue
                assert idx.min() >= 0 and idx.max() < cap
                draws += idx.size
            assert draws > 10_000
        finally:
            stop.set()
            proc.join(30)
        assert proc.exitcode == 0


def _child_hammers(name, offset, nbytes, cap, k, stop):
    tree, shm = attach_in_child(name, offset, nbytes, cap, k)
    rng = np.random.default_rng(1)
    while not stop.is_set():
        p = rng.random(256) * 10.0 ** rng.integers(-3, 3)
        p[rng.random(256) < 0.3] = 0.0
        tree.update(rng.integers(0, cap, 256), p)
    del tree
    shm.close()


def test_simd_and_portable_descents_agree(tmp_path):
    """K=16 descents use AVX-512 where the CPU has it; PAL_NO_AVX512=1 forces the
    portable scan.  Both must pick the same leaves (they may differ only for a mass
    within rounding of a boundary, which random masses do not hit)."""
    import subprocess
    import sys

    script = tmp_path / "descend.py"
    script.write_text(
        "import sys, numpy as np\n"
        "from pal_hpc.replay import KSumTree\n"
        "rng = np.random.default_rng(0)\n"
        "cap = 100_003\n"
        "t = KSumTree(cap, 16)\n"
        "p = rng.random(cap) * 10.0 ** rng.integers(-3, 3, cap)\n"
        "p[rng.random(cap) < 0.3] = 0\n"
        "t.update(np.arange(cap), p)\n"
        "idx = np.concatenate([t.find(rng.random(50_000) * t.total()), t.sample(50_000, rng=1)])\n"
        "np.save(sys.argv[1], idx)\n")
    out = {}
    for flag in ("0", "1"):
        env = dict(os.environ, PAL_NO_AVX512=flag)
        subprocess.run([sys.executable, str(script), str(tmp_path / f"{flag}.npy")],
                       env=env, check=True, timeout=120)
        out[flag] = np.load(tmp_path / f"{flag}.npy")
    np.testing.assert_array_equal(out["0"], out["1"])
