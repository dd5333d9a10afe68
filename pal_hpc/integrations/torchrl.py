"""A torchrl `PrioritizedSampler` on pal_hpc's K-ary sum tree.

    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from pal_hpc.integrations.torchrl import KSumPrioritizedSampler
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100_000), batch_size=256,
                                sampler=KSumPrioritizedSampler(100_000, alpha=0.6, beta=0.4),
                                priority_key="td_error")

It is a subclass of torchrl's `PrioritizedSampler`, so every place torchrl checks for
one (`update_tensordict_priority`, a buffer built over a filled storage) treats it as
one, with the same arguments (max_capacity, alpha, beta, eps, reduction,
max_priority_within_buffer) and contract: `sample` returns (index, {"priority_weight":
w}) with w = (p_i / p_min) ** -beta over the tree's values p = (priority + eps) ** alpha,
the buffer adds "index"; writers call `mark_update`, which gives new rows the largest
priority seen; `update_priority` skips index -1 (MaxValueWriter's "not written").
None of torchrl's C++ segment trees is used.  Unlike torchrl's, bad priorities
(negative, NaN, infinite) and indices outside [0, max_capacity) raise before anything
changes, and `dumps` writes JSON and .npy files only (loaded without pickle).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchrl.data.replay_buffers.samplers import PrioritizedSampler
from torchrl.data.replay_buffers.utils import unravel_index

from pal_hpc.integrations.per import ProportionalPriorities, check_exponent

__all__ = ["KSumPrioritizedSampler"]

_REDUCTIONS = ("max", "min", "median", "mean")


def _as_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


class KSumPrioritizedSampler(PrioritizedSampler):
    """Drop-in for torchrl's `PrioritizedSampler` on `KSumTree` (CPU).

    `fanout` is the tree's K; `stratified=True` draws one index from each of
    batch_size equal slices of the mass (PER paper) instead of torchrl's i.i.d. draws.
    """

    _STATE_SCHEMA_VERSION = 1

    def __init__(self, max_capacity: int, alpha: float, beta: float, eps: float = 1e-8,
                 dtype: torch.dtype = torch.float, reduction: str = "max",
                 max_priority_within_buffer: bool = False, device=None, *,
                 fanout: int = 16, stratified: bool = False) -> None:
        # torchrl's __init__ builds its C++ trees; this one builds ours instead.
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"KSumPrioritizedSampler keeps its tree on the CPU, got device={device!r}")
        self._per = ProportionalPriorities(max_capacity, alpha, eps, fanout)
        self._max_capacity = int(max_capacity)
        self._beta = check_exponent("beta", beta)
        self.reduction = reduction
        self.dtype = dtype
        self.stratified = bool(stratified)
        self._max_priority_within_buffer = bool(max_priority_within_buffer)
        self._device = None
        self._max_priority = (None, None)

    def __repr__(self):
        return (f"{type(self).__name__}(max_capacity={self._max_capacity}, alpha={self.alpha}, "
                f"beta={self.beta}, eps={self.eps}, reduction={self.reduction})")

    # -- parameters (ParameterScheduler sets alpha/beta by attribute) ------------------
    @property
    def alpha(self) -> float:
        """The priority exponent; setting it re-raises every stored priority exactly."""
        return self._per.alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        self._per.set_alpha(value)

    @property
    def _alpha(self) -> float:
        return self._per.alpha

    @property
    def beta(self) -> float:
        """The importance-sampling exponent."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._beta = check_exponent("beta", value)

    @property
    def eps(self) -> float:
        """Added to every priority before the alpha power."""
        return self._per.eps

    @property
    def _eps(self) -> float:
        return self._per.eps

    @property
    def device(self) -> torch.device:
        """Where the tree lives: always the CPU."""
        return torch.device("cpu")

    def _maybe_init_from_storage(self, storage) -> None:
        return   # one CPU tree, whatever the storage's device

    @property
    def default_priority(self) -> float:
        """The raw priority new rows get: the largest seen (1.0 before any)."""
        mp = self._max_priority[0]
        return 1.0 if mp is None else float(mp)

    def priorities(self) -> np.ndarray:
        """Current raw priorities of every slot, in storage order (0 where unset)."""
        p = self._per.p
        return np.where(p > 0, np.maximum(p - self.eps, 0.0), 0.0)

    # -- hooks the buffer and writers call -------------------------------------------
    def _empty(self) -> None:
        self._per.clear()
        self._max_priority = (None, None)

    def _init(self) -> None:
        self._empty()

    def add(self, index) -> None:
        """Called after a row is written: forget the max if it was overwritten."""
        self._maybe_erase_max_priority(index)

    def extend(self, index) -> None:
        """Called after rows are written: forget the max if it was overwritten."""
        self._maybe_erase_max_priority(index)

    def _maybe_erase_max_priority(self, index) -> None:
        if not self._max_priority_within_buffer or self._max_priority[1] is None:
            return
        if isinstance(index, slice):
            hit = self._max_priority[1] in range(*index.indices(self._max_capacity))
        else:
            if isinstance(index, tuple):
                index = torch.stack([torch.as_tensor(i) for i in index], -1)
            flat = self._flat_index(_as_numpy(index), None, strict=False)
            hit = bool(np.any(flat == self._max_priority[1]))
        if hit:
            self._max_priority = (None, None)

    def mark_update(self, index, *, storage=None) -> None:
        """New rows at `index` get the default (largest seen) priority."""
        self.update_priority(index, self.default_priority, storage=storage)

    def _flat_index(self, index: np.ndarray, storage, strict: bool = True) -> np.ndarray:
        """Flat tree slots of `index` (int, 1-D, or (N, ndim) for an N-d storage)."""
        if index.dtype.kind not in "iu":
            raise TypeError(f"index must be integers, got dtype {index.dtype}")
        if index.ndim > 1:
            if storage is None:
                if not strict:
                    return np.zeros(0, np.int64)
                raise RuntimeError("storage should be provided to update_priority when the "
                                   "storage has more than one dimension")
            index = np.ravel_multi_index(tuple(index.reshape(-1, index.shape[-1]).T),
                                         tuple(storage.shape))
        return index.reshape(-1).astype(np.int64, copy=False)

    def update_priority(self, index, priority, *, storage=None) -> None:
        """Set the raw priority of rows `index` (the tree holds (p + eps) ** alpha).

        `priority` is a number or one value per row; index -1 is skipped (not written).
        Raises IndexError for an index outside [0, max_capacity) and ValueError for a
        negative, NaN or infinite priority, before anything changes."""
        if isinstance(index, tuple):
            index = torch.stack([torch.as_tensor(i) for i in index], -1)
        idx = self._flat_index(np.atleast_1d(_as_numpy(index)), storage)
        pr = _as_numpy(priority)
        if pr.size > 1 or (pr.ndim and pr.size == idx.size):
            if pr.size != idx.size:
                raise ValueError(f"priority has shape {pr.shape} but index has {idx.size} rows; "
                                 f"give a number or one priority per row")
            pr = pr.reshape(-1)
        else:
            pr = pr.reshape(())
        keep = idx != -1
        if not keep.all():
            idx = idx[keep]
            pr = pr[keep] if pr.ndim else pr
        if idx.size == 0:
            return
        raw = self._per.set(idx, pr)
        self._track_max(idx, raw)

    def _track_max(self, idx: np.ndarray, raw: np.ndarray) -> None:
        if raw.shape != idx.shape:
            raw = np.broadcast_to(raw, idx.shape)
        j = int(np.argmax(raw))
        value, where = self._max_priority
        if value is None or raw[j] > value:
            self._max_priority = (float(raw[j]), int(idx[j]))
        if self._max_priority_within_buffer and (value is None or np.any(idx == where)):
            # The max row was overwritten or re-prioritised: the largest one still held.
            k = int(np.argmax(self._per.p))
            self._max_priority = (max(float(self._per.p[k]) - self.eps, 0.0), k)

    # -- sampling ----------------------------------------------------------------------
    def sample(self, storage, batch_size: int):
        """`batch_size` indices drawn in proportion to (p + eps) ** alpha, and
        {"priority_weight": (p_i / p_min) ** -beta}."""
        n = len(storage)
        if n == 0:
            raise RuntimeError("Cannot sample from an empty storage.")
        if self._rng is not None:
            u = torch.rand(batch_size, generator=self._rng, dtype=torch.float64).numpy()
        else:
            u = np.random.random(batch_size)
        idx, weights = self._per.sample(u, self._beta, self.stratified)
        if idx.size and idx.max() >= n:
            raise RuntimeError(f"index {int(idx.max())} has a priority but the storage holds "
                               f"only {n} rows (update_priority was given a row never written)")
        index = torch.from_numpy(idx)
        if storage.ndim > 1:
            index = unravel_index(index, storage.shape)
        return index, {"priority_weight": torch.from_numpy(weights)}

    # -- state -------------------------------------------------------------------------
    def _metadata(self) -> dict[str, Any]:
        mp, mi = self._max_priority
        return {"_schema_version": self._STATE_SCHEMA_VERSION, "_alpha": self.alpha,
                "_beta": self._beta, "_eps": self.eps, "_max_capacity": self._max_capacity,
                "_max_priority": [mp, mi]}

    def _restore(self, meta: dict[str, Any], p: np.ndarray) -> None:
        cap = int(meta["_max_capacity"])
        if cap != self._max_capacity:
            raise ValueError(f"saved sampler has max_capacity={cap}, this one "
                             f"{self._max_capacity}")
        if not math.isclose(float(meta["_eps"]), self.eps):
            self._per = ProportionalPriorities(cap, self.alpha, float(meta["_eps"]), self._per.fanout)
        self._per.set_alpha(float(meta["_alpha"]))
        self.beta = float(meta["_beta"])
        self._per.load(p)
        mp, mi = meta["_max_priority"]
        self._max_priority = (None, None) if mp is None else (float(mp), int(mi))

    def state_dict(self) -> dict[str, Any]:
        """Parameters, the max priority and every slot's p = priority + eps (a copy)."""
        return {**self._metadata(), "_priorities": torch.from_numpy(self._per.p.copy())}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (the source is neither changed nor shared)."""
        self._restore(state_dict, _as_numpy(state_dict["_priorities"]).astype(np.float64))

    def dumps(self, path) -> None:
        """Write sampler_metadata.json and priorities.npy under `path`."""
        path = Path(path).absolute()
        path.mkdir(parents=True, exist_ok=True)
        np.save(path / "priorities.npy", self._per.p, allow_pickle=False)
        with open(path / "sampler_metadata.json", "w") as f:
            json.dump(self._metadata(), f)

    def loads(self, path) -> None:
        """Read what `dumps` wrote (no pickle), after checking the capacity matches."""
        path = Path(path).absolute()
        with open(path / "sampler_metadata.json") as f:
            meta = json.load(f)
        self._restore(meta, np.load(path / "priorities.npy", allow_pickle=False))
