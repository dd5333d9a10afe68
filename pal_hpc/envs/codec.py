"""A small binary encoding for the dicts that cross the lockstep protocol: the `info` of
each environment step and the seeds and options of a reset.

Only plain data is representable (None, bool, int, float, str, bytes, numpy scalars and
arrays of numeric or bool dtype, and dicts, lists and tuples of those), plus two gymnasium
values that are plain data in a wrapper: a `gymnasium.spaces.GraphInstance` (Graph
observations) and a `numpy.random.Generator` (an env's `np_random`, as its bit generator's
state).  Decoding never runs code, unlike pickle, and the decoded values have the types
the environment produced, so gymnasium's `VectorEnv._add_info` and `concatenate` batch
them exactly as they do for `SyncVectorEnv`.
"""

from __future__ import annotations

import struct

import numpy as np
from gymnasium.spaces import GraphInstance

(_NONE, _FALSE, _TRUE, _INT, _FLOAT, _STR, _BYTES, _NPSCALAR, _ARRAY, _DICT, _LIST, _TUPLE,
 _GRAPH, _RNG, _BIGINT) = range(15)
# Bit generators a Generator may be rebuilt from (by name, never by an import).
_BIT_GENERATORS = {name: getattr(np.random, name)
                   for name in ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")}
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
_U32 = struct.Struct("<I")


class CodecError(TypeError):
    """A value that the lockstep protocol cannot carry."""


def _dtype_ok(dtype: np.dtype) -> bool:
    return dtype.kind in "biufc" and not dtype.hasobject


def _enc(value, out: bytearray, path: str) -> None:
    if value is None:
        out.append(_NONE)
    elif value is True or value is False:
        out.append(_TRUE if value else _FALSE)
    elif type(value) is int:
        if -(1 << 63) <= value < (1 << 63):
            out.append(_INT)
            out += _I64.pack(value)
        else:                              # e.g. a PCG64 state: 128 bits
            raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            out.append(_BIGINT)
            out += _U32.pack(len(raw))
            out += raw
    elif type(value) is float:
        out.append(_FLOAT)
        out += _F64.pack(value)
    elif type(value) is str:
        raw = value.encode("utf-8")
        out.append(_STR)
        out += _U32.pack(len(raw))
        out += raw
    elif type(value) is bytes:
        out.append(_BYTES)
        out += _U32.pack(len(value))
        out += value
    elif isinstance(value, np.generic) and _dtype_ok(value.dtype):
        ds = value.dtype.str.encode()
        out.append(_NPSCALAR)
        out.append(len(ds))
        out += ds
        out += value.tobytes()
    elif isinstance(value, np.ndarray) and _dtype_ok(value.dtype):
        ds = value.dtype.str.encode()
        out.append(_ARRAY)
        out.append(len(ds))
        out += ds
        out.append(value.ndim)
        for n in value.shape:
            out += _U32.pack(n)
        out += np.ascontiguousarray(value).tobytes()
    elif isinstance(value, dict):
        out.append(_DICT)
        out += _U32.pack(len(value))
        for key, item in value.items():
            if type(key) is not str:
                raise CodecError(f"{path}: dict key {key!r} is not a str")
            raw = key.encode("utf-8")
            out += _U32.pack(len(raw))
            out += raw
            _enc(item, out, f"{path}[{key!r}]")
    elif isinstance(value, GraphInstance):
        out.append(_GRAPH)
        for k, item in enumerate(value):
            _enc(item, out, f"{path}.{value._fields[k]}")
    elif isinstance(value, np.random.Generator):
        bits = value.bit_generator
        name = type(bits).__name__
        if name not in _BIT_GENERATORS:
            raise CodecError(f"{path}: a Generator over {name} cannot cross the lockstep protocol")
        out.append(_RNG)
        _enc(bits.state, out, f"{path}.bit_generator.state")
    elif type(value) in (list, tuple):
        out.append(_LIST if type(value) is list else _TUPLE)
        out += _U32.pack(len(value))
        for k, item in enumerate(value):
            _enc(item, out, f"{path}[{k}]")
    else:
        raise CodecError(f"{path}: a {type(value).__name__} cannot cross the lockstep "
                         f"protocol (plain data only: numbers, str, bytes, numpy arrays, "
                         f"and dicts, lists, tuples of them)")


def encode(value, path: str = "value") -> bytes:
    """Bytes for `value`; CodecError names the first part that is not plain data."""
    out = bytearray()
    _enc(value, out, path)
    return bytes(out)


def _dec(buf: memoryview, pos: int):
    tag = buf[pos]
    pos += 1
    if tag == _NONE:
        return None, pos
    if tag == _FALSE:
        return False, pos
    if tag == _TRUE:
        return True, pos
    if tag == _INT:
        return _I64.unpack_from(buf, pos)[0], pos + 8
    if tag == _FLOAT:
        return _F64.unpack_from(buf, pos)[0], pos + 8
    if tag == _BIGINT:
        n = _U32.unpack_from(buf, pos)[0]
        return int.from_bytes(bytes(buf[pos + 4:pos + 4 + n]), "little", signed=True), pos + 4 + n
    if tag in (_STR, _BYTES):
        n = _U32.unpack_from(buf, pos)[0]
        pos += 4
        raw = bytes(buf[pos:pos + n])
        return (raw.decode("utf-8") if tag == _STR else raw), pos + n
    if tag in (_NPSCALAR, _ARRAY):
        k = buf[pos]
        dtype = np.dtype(bytes(buf[pos + 1:pos + 1 + k]).decode())
        if not _dtype_ok(dtype):
            raise CodecError(f"refusing to decode dtype {dtype}")
        pos += 1 + k
        if tag == _NPSCALAR:
            value = np.frombuffer(buf, dtype, 1, pos)[0]
            return value, pos + dtype.itemsize
        ndim = buf[pos]
        pos += 1
        shape = tuple(_U32.unpack_from(buf, pos + 4 * d)[0] for d in range(ndim))
        pos += 4 * ndim
        count = int(np.prod(shape, dtype=np.int64))
        value = np.frombuffer(buf, dtype, count, pos).reshape(shape).copy()
        return value, pos + count * dtype.itemsize
    if tag == _DICT:
        n = _U32.unpack_from(buf, pos)[0]
        pos += 4
        out = {}
        for _ in range(n):
            k = _U32.unpack_from(buf, pos)[0]
            key = bytes(buf[pos + 4:pos + 4 + k]).decode("utf-8")
            out[key], pos = _dec(buf, pos + 4 + k)
        return out, pos
    if tag in (_LIST, _TUPLE):
        n = _U32.unpack_from(buf, pos)[0]
        pos += 4
        items = []
        for _ in range(n):
            item, pos = _dec(buf, pos)
            items.append(item)
        return (items if tag == _LIST else tuple(items)), pos
    if tag == _GRAPH:
        parts = []
        for _ in range(3):
            item, pos = _dec(buf, pos)
            parts.append(item)
        return GraphInstance(*parts), pos
    if tag == _RNG:
        state, pos = _dec(buf, pos)
        cls = _BIT_GENERATORS.get(state.get("bit_generator") if isinstance(state, dict) else None)
        if cls is None:
            raise CodecError(f"refusing to rebuild a Generator from {state!r:.80}")
        bits = cls()
        bits.state = state
        return np.random.Generator(bits), pos
    raise CodecError(f"unknown tag {tag} at byte {pos - 1}")


def decode(buf) -> object:
    """The value `encode` wrote into `buf` (bytes or any buffer)."""
    value, _ = _dec(memoryview(buf).cast("B"), 0)
    return value
