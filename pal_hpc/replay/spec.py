"""A replay's spec and memory layout: the checks of field specs, sizes and batches, the
byte offsets of the parts of one buffer (control words, tree, slot counters, columns),
and the check of a saved state array.  SharedReplay and FrameStackReplay build on it."""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from pal_hpc.replay._ksumtree import KSumTree
from pal_hpc.replay._replaycore import control_words

RESERVED = ("indices", "weights", "tickets")
_ALIGN = 64


def _round_up(x: int, a: int = _ALIGN) -> int:
    return (x + a - 1) // a * a


def _check_spec(spec) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    if not isinstance(spec, Mapping) or not spec:
        raise ValueError("spec must be a non-empty mapping of field name -> (shape, dtype)")
    out = {}
    for name, entry in spec.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"spec field name {name!r} must be an identifier string")
        if name in RESERVED:
            raise ValueError(f"spec field name {name!r} is reserved (sample() returns it)")
        if type(entry).__name__ == "FrameStack":
            raise ValueError(f"spec[{name!r}] is a FrameStack: build a FrameStackReplay "
                             f"(pal_hpc.replay.frames) for frame-stack fields")
        try:
            shape, dtype = entry
        except (TypeError, ValueError):
            raise ValueError(f"spec[{name!r}] must be (shape, dtype), got {entry!r}") from None
        shape = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)
        if not all(isinstance(d, numbers.Integral) and d >= 0 for d in shape):
            raise ValueError(f"spec[{name!r}] shape {shape} must hold non-negative integers")
        try:
            dtype = np.dtype(dtype)
        except TypeError:
            raise ValueError(f"spec[{name!r}] dtype {dtype!r} is not a numpy dtype") from None
        if dtype.hasobject or dtype.itemsize == 0:
            raise ValueError(f"spec[{name!r}] dtype {dtype} cannot live in shared memory")
        out[name] = (tuple(int(d) for d in shape), dtype)
    return out


def _positive_int(value, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _finite(value, name: str, minimum: float = 0.0) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {value!r}") from None
    if not (np.isfinite(v) and v >= minimum):
        raise ValueError(f"{name} must be a finite number >= {minimum}, got {value!r}")
    return v


@dataclass(frozen=True)
class _Layout:
    """Byte offsets of the parts of one buffer (see the module docstring)."""
    control_words: int
    tree_off: int
    tree_nbytes: int
    seq_off: int
    col_off: dict[str, int]
    row_bytes: dict[str, int]
    nbytes: int


def _plan(spec, capacity: int, regions: int, fanout, extra_words: int = 0) -> _Layout:
    """The layout of a buffer; Python ints throughout, so nothing wraps.  `extra_words`
    control words follow the regions' (a frame replay keeps its stream counters there)."""
    words = control_words(regions) + extra_words
    tree_nbytes = KSumTree.nbytes(capacity, fanout)      # validates fanout and capacity
    off = _round_up(8 * words)
    tree_off = off
    off = _round_up(off + tree_nbytes)
    seq_off = off
    off = _round_up(off + 8 * capacity)
    col_off, row_bytes = {}, {}
    for name, (shape, dtype) in spec.items():
        col_off[name] = off
        row_bytes[name] = math.prod(shape) * dtype.itemsize
        off = _round_up(off + capacity * row_bytes[name])
    # allocate_shared and aligned_empty add _ALIGN bytes of slack.
    if off > sys.maxsize - _ALIGN:
        raise ValueError(f"a replay of capacity {capacity} with this spec needs {off} bytes, "
                         f"more than this platform can address ({sys.maxsize - _ALIGN})")
    return _Layout(words, tree_off, tree_nbytes, seq_off, col_off, row_bytes, off)


def _read_only(arr: np.ndarray) -> np.ndarray:
    view = arr.view()
    view.flags.writeable = False
    return view


def _state_array(state, key: str, dtype, shape: tuple):
    """state[key] if its dtype and shape are these, else a ValueError naming it."""
    arr = state[key]
    if not (hasattr(arr, "dtype") and hasattr(arr, "shape")):
        arr = np.asarray(arr)
    if np.dtype(arr.dtype) != np.dtype(dtype) or tuple(arr.shape) != tuple(shape):
        raise ValueError(f"state array {key!r} has dtype {np.dtype(arr.dtype)} and shape "
                         f"{tuple(arr.shape)}; this buffer needs {np.dtype(dtype)} and {shape}")
    return arr


def check_batch(spec, batch):
    """The arrays of `batch` (field -> array with leading dim n) and n, checked against
    `spec` exactly (fields, shapes, dtypes): bad input raises before anything is written."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"batch must be a mapping of field -> array, got {type(batch).__name__}")
    missing = [k for k in spec if k not in batch]
    if missing:
        raise ValueError(f"batch is missing field(s) {missing}")
    extra = [k for k in batch if k not in spec]
    if extra:
        raise ValueError(f"batch has unknown field(s) {extra}; the spec has {list(spec)}")
    arrays, n = {}, None
    for name, (shape, dtype) in spec.items():
        arr = np.asarray(batch[name])
        if arr.ndim == 0:
            raise ValueError(f"field {name!r} needs a leading batch dimension, got a scalar")
        if n is None:
            n = arr.shape[0]
        if arr.shape != (n,) + shape:
            raise ValueError(f"field {name!r} has shape {arr.shape}, expected {(n,) + shape} "
                             f"(batch of {n})")
        if arr.dtype != dtype:
            # Exact match: a silent cast would hide a wrong column (an int32 action
            # space, float64 observations) and cost a copy on the hot path.
            raise ValueError(f"field {name!r} has dtype {arr.dtype}, the spec says {dtype} "
                             f"(convert with .astype(np.{dtype.name}))")
        arrays[name] = arr
    if n == 0:
        raise ValueError("batch is empty")
    return arrays, n
