"""Root attributes of our HDF5 files: what a value is stored as, read back as, and the
cleaning of text that comes from outside the program.

HDF5 stores a Python string as a variable-length UTF-8 string, which holds no NUL byte
and no lone surrogate; h5py raises a bare `ValueError` ("VLEN strings do not support
embedded NULLs") or `UnicodeEncodeError` from deep inside the write.  Text we did not
write ourselves can hold either: Open MPI's `MPI_Get_library_version` string ends in a
NUL, a host name or a file name may be undecodable bytes (surrogate-escaped by Python).
`clean_text` makes such text storable; `attr_value` refuses anything else that cannot be
stored, naming the attribute, before the file is touched.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

_INT64 = (-2 ** 63, 2 ** 63 - 1)
_KEEP = "\n\t"          # the only control characters clean_text keeps (MPICH's version
                        # string is several lines)


def clean_text(text: str) -> str:
    """`text` without NULs, other control characters (but newline and tab), lone
    surrogates and trailing whitespace: what may be stored as an HDF5 string."""
    return "".join(ch for ch in text
                   if (ch.isprintable() or ch in _KEEP) and not "\ud800" <= ch <= "\udfff"
                   ).rstrip()


def _problem(value: str) -> str | None:
    if "\x00" in value:
        return "holds a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"is not valid UTF-8 text ({exc.reason} at position {exc.start})"
    return None


def attr_value(key: str, value: Any) -> Any:
    """What a root attribute stores for `value`: scalars as is, containers as JSON.

    Raises TypeError for a type HDF5 attributes do not take and ValueError for a string
    or integer that cannot be stored (a NUL, invalid UTF-8, beyond int64); both name
    `key` and say how to clean the value (`clean_text`).
    """
    if value is None:
        return ""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (dict, list, tuple)):
        try:
            value = json.dumps(value)       # escapes NULs and control characters
        except (TypeError, ValueError) as exc:
            raise TypeError(f"metrics attribute {key!r}: cannot store it as JSON: "
                            f"{exc}") from None
    if isinstance(value, str):
        problem = _problem(value)
        if problem:
            raise ValueError(f"metrics attribute {key!r}: the text {value[:60]!r} {problem}; "
                             "HDF5 cannot store it (pal_hpc.io.attrs.clean_text cleans "
                             "text from outside)")
        return value
    if isinstance(value, bool | float):
        return value
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise ValueError(f"metrics attribute {key!r}: the integer {value} is beyond "
                             "int64, which HDF5 attributes hold")
        return value
    raise TypeError(f"metrics attribute {key!r}: cannot store a {type(value).__name__}")


def decode_attr(value: Any) -> Any:
    """Inverse of `attr_value`: JSON containers back to dicts/lists, numpy to Python."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        if value[:1] in ("{", "["):
            try:
                return json.loads(value)
            except ValueError:
                return value
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value
