"""Prioritized replay: the native K-ary sum tree, its numpy reference, and the
node-shared replay buffer built on them."""

from pal_hpc.replay._ksumtree import KSumTree, aligned_empty, max_threads
from pal_hpc.replay.reference import ReferenceSumTree
from pal_hpc.replay.shared import SharedReplay
from pal_hpc.replay.frames import FrameStack, FrameStackReplay

__all__ = ["FrameStack", "FrameStackReplay", "KSumTree", "ReferenceSumTree", "SharedReplay", "aligned_empty", "max_threads"]
