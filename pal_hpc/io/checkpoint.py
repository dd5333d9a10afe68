"""HDF5 checkpoints: written atomically, verified by checksum, loaded without pickle.

A checkpoint is `<run dir>/checkpoints/step_<N>.h5` (N = learner updates), written by
rank 0, plus `step_<N>_replay<k>.h5` per node when replay buffers are saved, each
written by that node's first rank (serial HDF5: one writer per file).  Every file is
written to a temporary name, fsynced and renamed, and carries a checksum of all its
datasets and attributes; the main file also records its replay files' checksums.
A truncated or corrupt checkpoint is skipped, with a warning, for the previous one.

Values are stored as HDF5 datasets (arrays, tensors) and JSON attributes (numbers,
strings, lists, None), so loading never executes code from the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from pathlib import Path
from typing import Callable

import h5py
import numpy as np
import torch

FORMAT_VERSION = 1
_STEP_RE = re.compile(r"^step_(\d+)\.h5$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated, corrupt, or does not fit this run."""


def checkpoint_dir(run_dir) -> Path:
    return Path(run_dir) / "checkpoints"


def main_path(run_dir, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"step_{step:010d}.h5"


def replay_path(main: Path, node: int) -> Path:
    return main.with_name(main.stem + f"_replay{node}.h5")


# -- writing ------------------------------------------------------------------

def write_atomic(path: Path, fill: Callable[[h5py.File], None]) -> str:
    """Create `path` through a temporary file: fill it, add its checksum, fsync, rename.

    Returns the checksum.  A crash at any point leaves either no file or a whole one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with h5py.File(tmp, "w") as f:
        fill(f)
        digest = content_checksum(f)
        f.attrs["checksum"] = digest
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return digest


def content_checksum(f: h5py.File) -> str:
    """SHA-256 over every dataset (name, dtype, shape, bytes) and attribute, in name order."""
    h = hashlib.sha256()

    def attrs_of(obj):
        for key in sorted(obj.attrs):
            if obj.name == "/" and key == "checksum":
                continue
            h.update(f"@{obj.name}/{key}={_attr_text(obj.attrs[key])}".encode())

    attrs_of(f)
    names: list[str] = []
    f.visit(names.append)
    for name in sorted(names):
        obj = f[name]
        attrs_of(obj)
        if isinstance(obj, h5py.Dataset):
            h.update(f"#{name}:{obj.dtype.str}:{obj.shape}".encode())
            if obj.size:
                _hash_dataset(h, obj)
    return h.hexdigest()


def _hash_dataset(h, ds: h5py.Dataset, chunk_bytes: int = 64 << 20) -> None:
    if ds.ndim == 0:
        h.update(np.ascontiguousarray(ds[()]).tobytes())
        return
    row = max(1, ds.dtype.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64)))
    step = max(1, chunk_bytes // row)
    for start in range(0, ds.shape[0], step):
        h.update(np.ascontiguousarray(ds[start:start + step]).tobytes())


def _attr_text(value) -> str:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.ndarray):
        return value.tobytes().hex()
    return str(value)


def save_tree(group: h5py.Group, obj) -> None:
    """Store a nested dict of tensors / arrays / JSON values under `group`."""
    for key, value in obj.items():
        name = _key_name(key)
        if isinstance(value, dict):
            sub = group.create_group(name)
            sub.attrs["kind"] = "dict"
            save_tree(sub, value)
        elif isinstance(value, torch.Tensor):
            ds = group.create_dataset(name, data=value.detach().cpu().numpy())
            ds.attrs["kind"] = "tensor"
        elif isinstance(value, np.ndarray):
            ds = group.create_dataset(name, data=value)
            ds.attrs["kind"] = "ndarray"
        else:
            group.attrs["json:" + name] = json.dumps(_jsonable(value))


def load_tree(group: h5py.Group) -> dict:
    """Inverse of `save_tree`: tensors come back as torch tensors, JSON values as Python."""
    out: dict = {}
    for name, obj in group.items():
        key = _key_value(name)
        if isinstance(obj, h5py.Group):
            out[key] = load_tree(obj)
        elif obj.attrs.get("kind") == "tensor":
            out[key] = torch.from_numpy(np.array(obj[()]))
        else:
            out[key] = np.array(obj[()])
    for attr, text in group.attrs.items():
        if attr.startswith("json:"):
            out[_key_value(attr[5:])] = json.loads(text)
    return out


def _key_name(key) -> str:
    # Optimizer state is keyed by parameter index: keep ints distinguishable from strings.
    return f"int:{key}" if isinstance(key, int) else str(key)


def _key_value(name: str):
    return int(name[4:]) if name.startswith("int:") else name


def _jsonable(value):
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    return value


# -- finding and checking ------------------------------------------------------

def verify(path: Path) -> dict:
    """Open, re-checksum and return the root attributes of a checkpoint file, or raise."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint")
    try:
        with h5py.File(path, "r") as f:
            stored = f.attrs.get("checksum")
            if stored is None:
                raise CheckpointError(f"{path}: no checksum (incomplete file)")
            if content_checksum(f) != stored:
                raise CheckpointError(f"{path}: checksum mismatch (corrupt file)")
            return {k: f.attrs[k] for k in f.attrs}
    except (OSError, KeyError) as exc:
        raise CheckpointError(f"{path}: unreadable ({exc})") from None


def verify_all(main: Path) -> dict:
    """Verify a main checkpoint file and the replay files it lists; returns its attributes."""
    attrs = verify(main)
    for name, digest in json.loads(attrs.get("replay_files", "{}")).items():
        rattrs = verify(Path(main).with_name(name))
        if rattrs["checksum"] != digest:
            raise CheckpointError(f"{name}: does not belong to {Path(main).name}")
    return attrs


def list_checkpoints(run_dir) -> list[Path]:
    """Main checkpoint files in `run_dir`, oldest first."""
    d = checkpoint_dir(run_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _STEP_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_valid(run_dir) -> Path:
    """The newest checkpoint that verifies; warns about each newer one that does not."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            verify_all(path)
            return path
        except CheckpointError as exc:
            warnings.warn(f"skipping checkpoint: {exc}; trying the previous one", stacklevel=2)
    raise CheckpointError(f"no valid checkpoint in {checkpoint_dir(run_dir)}")


def prune(run_dir, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints (and their replay files)."""
    for path in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        for extra in path.parent.glob(path.stem + "_replay*.h5"):
            extra.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
