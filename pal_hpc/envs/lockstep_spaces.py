"""How a gymnasium space crosses the lockstep protocol.

Fixed-shape spaces -- Box, Discrete, MultiDiscrete, MultiBinary, and Tuple/Dict spaces made
only of them -- live in the shared block as one batch array per leaf (a Tuple of a Discrete
and a Box is two arrays, `(n,)` and `(n, *box.shape)`), laid out exactly as gymnasium's
`create_empty_array` lays out the batch, so the batch is what `SyncVectorEnv` returns.
Every other space (Graph, Sequence, Text, OneOf, custom spaces, and composites holding one)
has values of varying size: those travel per environment in the protocol's binary
encoding (`pal_hpc.envs.codec`) and are batched by gymnasium's `concatenate`.
"""

from __future__ import annotations

from collections.abc import Iterator

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Tuple
from gymnasium.vector.utils import batch_space, create_empty_array

FIXED_LEAVES = (Box, Discrete, MultiDiscrete, MultiBinary)


def is_fixed(space: gym.Space) -> bool:
    """True when every value of `space` has the same shapes and dtypes."""
    if isinstance(space, FIXED_LEAVES):
        return True
    if isinstance(space, Tuple):
        return all(is_fixed(s) for s in space.spaces)
    if isinstance(space, Dict):
        return all(is_fixed(s) for s in space.spaces.values())
    return False


def is_gymnasium_space(space: gym.Space) -> bool:
    """True for gymnasium's own spaces (at every level): their values are plain data."""
    if not type(space).__module__.startswith("gymnasium.spaces"):
        return False
    subs = getattr(space, "spaces", None)
    if isinstance(space, Dict):
        subs = space.spaces.values()
    elif isinstance(space, gym.spaces.Sequence):
        subs = [space.feature_space]
    elif isinstance(space, gym.spaces.Graph):
        subs = [s for s in (space.node_space, space.edge_space) if s is not None]
    return all(is_gymnasium_space(s) for s in (subs or ()))


def _flatten(space: gym.Space, value, out: list) -> list:
    if isinstance(space, Tuple):
        for s, v in zip(space.spaces, value):
            _flatten(s, v, out)
    elif isinstance(space, Dict):
        for key, s in space.spaces.items():
            _flatten(s, value[key], out)
    else:
        out.append(value)
    return out


def _build(space: gym.Space, leaves: Iterator):
    if isinstance(space, Tuple):
        return tuple(_build(s, leaves) for s in space.spaces)
    if isinstance(space, Dict):
        return {key: _build(s, leaves) for key, s in space.spaces.items()}
    return next(leaves)


class SpacePlan:
    """The layout of one space (observations or actions) over `n` environments.

    `leaves`: (shape of one row, dtype str) of each shared batch array, in the space's
    order (empty when the space is not fixed-shape and its values are encoded)."""

    def __init__(self, single: gym.Space, n: int):
        self.single = single
        self.n = n
        self.fixed = is_fixed(single)
        self.simple = isinstance(single, FIXED_LEAVES)     # one leaf, no structure
        self.batched = batch_space(single, n)
        if self.fixed:
            template = _flatten(single, create_empty_array(single, n, fn=np.zeros), [])
            self.leaves = tuple((tuple(a.shape[1:]), a.dtype.str) for a in template)
            self.leaf_spaces = _flatten(single, _space_tree(self.batched), [])
        else:
            self.leaves, self.leaf_spaces = (), []

    def split(self, value) -> list:
        """One env's (or the batch's) value as its leaves, in `leaves` order."""
        return [value] if self.simple else _flatten(self.single, value, [])

    def join(self, leaves) -> object:
        """The structured value (per env or batched) from its leaves."""
        return leaves[0] if self.simple else _build(self.single, iter(leaves))


def _space_tree(batched: gym.Space):
    """The batched space as nested tuples/dicts of its leaf spaces (to walk with the
    single space's structure)."""
    if isinstance(batched, Tuple):
        return tuple(_space_tree(s) for s in batched.spaces)
    if isinstance(batched, Dict):
        return {k: _space_tree(s) for k, s in batched.spaces.items()}
    return batched


class ActionCheck:
    """Checks one leaf of a batch of actions against its batched space (Box or
    MultiDiscrete) and returns it as an array of the space's dtype; ValueError names
    the first environment whose action is out of bounds, before any worker sees it."""

    def __init__(self, batched: gym.Space, single: gym.Space):
        self.space, self.single = batched, single
        if isinstance(batched, Box):
            lo, hi = batched.low, batched.high
            self.kinds = "iufb" if batched.dtype.kind == "b" else "iuf"
            self.what = "numbers"
        elif isinstance(batched, MultiBinary):
            lo, hi = np.zeros(batched.shape, np.int8), np.ones(batched.shape, np.int8)
            self.kinds, self.what = "iub", "integers"
        else:                               # Discrete and MultiDiscrete batch to MultiDiscrete
            lo, hi = batched.start, batched.start + batched.nvec - 1
            self.kinds, self.what = "iub", "integers"
        self.lo, self.hi, self.lo_max, self.hi_min = lo, hi, lo.max(), hi.min()

    def __call__(self, a: np.ndarray, num_envs: int) -> np.ndarray:
        if a.shape != self.space.shape:
            raise ValueError(f"actions: shape {a.shape}, expected {self.space.shape} (one "
                             f"{self.single} action for each of the {num_envs} environments)")
        if a.dtype.kind not in self.kinds:
            raise ValueError(f"actions: dtype {a.dtype} for {self.single}; expected {self.what}")
        c = a.astype(self.space.dtype, copy=False) if isinstance(self.space, Box) else a
        # Fast path: every action within the tightest bounds.  NaN fails every
        # comparison, so it reaches the full check and is caught there.
        if not (c.min() >= self.lo_max and c.max() <= self.hi_min) and \
                not ((c >= self.lo) & (c <= self.hi)).all():
            ok = (c >= self.lo) & (c <= self.hi)
            bad = np.argwhere(~ok.reshape(num_envs, -1).all(axis=1))[0, 0]
            raise ValueError(f"actions: env {bad}'s action {a[bad].tolist()!r} is not in "
                             f"{self.single}")
        return c


def action_checks(plan: SpacePlan) -> list[ActionCheck]:
    """One `ActionCheck` per leaf of a fixed-shape action space."""
    singles = _flatten(plan.single, _space_tree(plan.single), [])
    return [ActionCheck(b, s) for b, s in zip(plan.leaf_spaces, singles)]
