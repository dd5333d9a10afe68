"""Prioritized replay: the native K-ary sum tree and its numpy reference."""

from pal_hpc.replay._ksumtree import KSumTree, aligned_empty, max_threads
from pal_hpc.replay.reference import ReferenceSumTree

__all__ = ["KSumTree", "ReferenceSumTree", "aligned_empty", "max_threads"]
