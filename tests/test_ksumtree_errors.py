"""Bad input raises a clear error and leaves the tree unchanged."""

import sys

import numpy as np
import pytest

from pal_hpc.replay import KSumTree, aligned_empty


@pytest.fixture
def tree():
    t = KSumTree(100, 4)
    t.update(np.arange(100), np.linspace(0.5, 2.0, 100))
    return t


def unchanged(tree, before):
    return np.array_equal(tree.buffer, before)


@pytest.mark.parametrize("bad, pos", [
    (-1.0, 2), (float("nan"), 1), (float("inf"), 0), (-np.inf, 3), (1e39, 2),
])
def test_bad_priority(tree, bad, pos):
    before = tree.buffer.copy()
    prios = [1.0, 1.0, 1.0, 1.0]
    prios[pos] = bad
    with pytest.raises(ValueError, match=rf"priorities\[{pos}\]"):
        tree.update([1, 2, 3, 4], prios)
    assert unchanged(tree, before)


@pytest.mark.parametrize("bad_index", [100, -1, 10**12])
def test_index_out_of_range(tree, bad_index):
    before = tree.buffer.copy()
    with pytest.raises(IndexError, match=str(bad_index)):
        tree.update([0, bad_index], [1.0, 1.0])
    with pytest.raises(IndexError):
        tree.get([bad_index])
    assert unchanged(tree, before)


def test_wrong_dtypes_and_shapes(tree):
    before = tree.buffer.copy()
    with pytest.raises(TypeError, match="integers"):
        tree.update(np.array([1.5, 2.0]), [1.0, 1.0])
    with pytest.raises(TypeError, match="integers"):
        tree.update(np.array([True, False]), [1.0, 1.0])
    with pytest.raises(TypeError, match="real numbers"):
        tree.update([1, 2], ["a", "b"])
    with pytest.raises(ValueError, match="shape"):
        tree.update([1, 2, 3], [1.0, 2.0])
    with pytest.raises(ValueError, match="1-D"):
        tree.update(np.zeros((2, 2), np.int64), np.ones((2, 2)))
    with pytest.raises(TypeError, match="integers"):
        tree.get([0.5])
    assert unchanged(tree, before)


def test_bad_masses(tree):
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"prefix_masses\[1\]"):
            tree.find([0.0, bad])
    with pytest.raises(ValueError, match="1-D"):
        tree.find(np.zeros((2, 2)))


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(capacity=0), ValueError, "capacity"),
    (dict(capacity=-5), ValueError, "capacity"),
    (dict(capacity=2.5), TypeError, "capacity"),
    (dict(capacity=10, fanout=3), ValueError, "fanout"),
    (dict(capacity=10, fanout=1), ValueError, "fanout"),
    (dict(capacity=10, fanout=8192), ValueError, "fanout"),
])
def test_bad_construction(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        KSumTree(**kwargs)


def test_bad_sample_arguments(tree):
    with pytest.raises(ValueError, match="batch_size"):
        tree.sample(0)
    with pytest.raises(TypeError, match="batch_size"):
        tree.sample(2.0)


def test_bad_buffers():
    need = KSumTree.nbytes(1000, 16)
    with pytest.raises(ValueError, match="needs"):
        KSumTree(1000, 16, buffer=aligned_empty(need - 1))
    ro = aligned_empty(need)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        KSumTree(1000, 16, buffer=ro)
    with pytest.raises(ValueError, match="read-only"):
        KSumTree(1000, 16, buffer=bytes(need))
    misaligned = aligned_empty(need + 8)[8:]
    with pytest.raises(ValueError, match="aligned"):
        KSumTree(1000, 16, buffer=misaligned)
    with pytest.raises(TypeError, match="buffer protocol"):
        KSumTree(1000, 16, buffer=object())
    with pytest.raises(ValueError, match="contiguous"):
        KSumTree(10, 2, buffer=aligned_empty(4 * need)[::2])


def test_attach_refuses_foreign_memory():
    need = KSumTree.nbytes(1000, 16)
    with pytest.raises(ValueError, match="never initialised"):
        KSumTree.attach(aligned_empty(need), 1000, 16)
    buf = aligned_empty(need)
    KSumTree(1000, 16, buffer=buf)
    with pytest.raises(ValueError, match="capacity"):
        KSumTree.attach(buf, 999, 16)
    with pytest.raises(ValueError):
        KSumTree.attach(aligned_empty(KSumTree.nbytes(1000, 8)), 1000, 8)


def test_num_threads_validation(tree):
    with pytest.raises(ValueError, match="num_threads"):
        tree.num_threads = 0
    tree.num_threads = 3
    assert tree.num_threads == 3


def reference_nbytes(capacity, fanout):
    """The layout of ksum_core.h in Python ints (which never wrap)."""
    up = lambda x, a: -(-x // a) * a                                    # noqa: E731
    sizes = [up(capacity, fanout)]
    while sizes[-1] // fanout > 1:
        sizes.append(up(sizes[-1] // fanout, fanout))
    sizes.append(1)
    off = up(64 + 4 * sizes[0], 64)
    for item in (8, 4):                                 # sum levels, then min levels
        for n in sizes[1:]:
            off = up(off + item * n, 64)
    return off


@pytest.mark.parametrize("fanout", [2, 4, 16, 4096])
@pytest.mark.parametrize("capacity", [1000, 2**40 + 1, 2**58, 2**60, 2**61, 2**62 - 1, 2**62,
                                      2**64 + 5])
def test_huge_capacity_never_wraps(capacity, fanout):
    """KSumTree(2**60, fanout=2) used to wrap nbytes to 384 bytes and then write far
    outside them.  Now nbytes is exact or the size is refused, before any allocation."""
    if capacity < 2**62 and reference_nbytes(capacity, fanout) <= sys.maxsize:
        assert KSumTree.nbytes(capacity, fanout) == reference_nbytes(capacity, fanout)
        return
    with pytest.raises(ValueError, match=str(capacity)):
        KSumTree.nbytes(capacity, fanout)
    with pytest.raises(ValueError, match=str(capacity)):
        KSumTree(capacity, fanout)
    with pytest.raises(ValueError, match=str(capacity)):
        KSumTree.layout(capacity, fanout)


def test_too_large_to_allocate_raises_memory_error_first():
    """A well-formed size beyond physical memory: MemoryError naming it, no attempt."""
    assert KSumTree.nbytes(2**60, 16) > 2**62
    with pytest.raises(MemoryError, match=str(2**60)):
        KSumTree(2**60, 16)
    with pytest.raises(MemoryError, match=str(2**60)):
        aligned_empty(2**60)
    for bad in (-1, 2**63, 1.5):
        with pytest.raises(ValueError, match="nbytes"):
            aligned_empty(bad)
