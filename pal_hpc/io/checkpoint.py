"""HDF5 checkpoints: written atomically, verified by checksum, loaded without pickle.

A checkpoint is `<run dir>/checkpoints/step_<N>.h5` (N = learner updates), written by
rank 0, plus `step_<N>_replay<k>_<tag>.h5` per node when replay buffers are saved, each
written by that node's first rank (serial HDF5: one writer per file).  Every file is
written to a temporary name, fsynced and renamed, and carries a checksum of all its
datasets and attributes; the main file also records its replay files' checksums.  The
tag is new for every checkpoint, so rewriting step N never touches the replay files
an existing step_<N>.h5 verifies against.

A truncated or corrupt checkpoint is skipped, with a warning, for the previous one;
`Pruner` keeps the newest checkpoints that verify and moves damaged ones aside into
`checkpoints/damaged/` (never deleting one that verifies in favour of one that does
not).

Values are stored as HDF5 datasets (arrays, tensors) and JSON attributes (numbers,
strings, lists, None), so loading never executes code from the file.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import h5py
import numpy as np

from pal_hpc.io.rundir import check_space

FORMAT_VERSION = 1
_STEP_RE = re.compile(r"^step_(\d+)\.h5$")
_REPLAY_RE = re.compile(r"^(step_\d+)_replay(\d+)(?:_[0-9a-f]+)?\.h5$")
DAMAGED = "damaged"          # checkpoints that failed verification
SUPERSEDED = "superseded"    # newer than the one an explicit --resume PATH went back to


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated, corrupt, or does not fit this run."""


def checkpoint_dir(run_dir) -> Path:
    return Path(run_dir) / "checkpoints"


def main_path(run_dir, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"step_{step:010d}.h5"


def replay_path(main: Path, node: int, tag: str = "") -> Path:
    """Node `node`'s replay file of checkpoint `main` (`tag` makes the name unique)."""
    return main.with_name(main.stem + f"_replay{node}" + (f"_{tag}" if tag else "") + ".h5")


def replay_file_of(main: Path, replay_files: dict, node: int) -> Path | None:
    """The replay file a main checkpoint lists for `node`, or None."""
    for name in replay_files:
        m = _REPLAY_RE.match(name)
        if m and m.group(1) == Path(main).stem and int(m.group(2)) == node:
            return Path(main).with_name(name)
    return None


def node_of_replay(name: str) -> int:
    """The node k of a replay file's name (`step_<N>_replay<k>_<tag>.h5`)."""
    m = _REPLAY_RE.match(Path(name).name)
    if not m:
        raise CheckpointError(f"{name}: not a replay file's name")
    return int(m.group(2))


# -- writing ------------------------------------------------------------------

_warned_slow = False


def _warn_if_near_deadline(path: Path, seconds: float) -> None:
    """Once: a write over half of --peer-timeout (h5py holds the GIL: no probe answered)."""
    global _warned_slow
    watched = sys.modules.get("pal_hpc.cluster.watched")   # only in a job's ranks
    timeout = watched.TIMEOUT[0] if watched else 0.0
    if not _warned_slow and 0 < timeout < 2 * seconds:
        _warned_slow = True
        print(f"pal_hpc: warning: writing {path.name} took {seconds:.0f} s, over half of "
              f"--peer-timeout {timeout:g} s: raise it", file=sys.stderr, flush=True)


def write_atomic(path: Path, fill: Callable[[h5py.File], None], expected_bytes: int = 0,
                 in_memory: bool = False) -> str:
    """Create `path` through a temporary file: fill it, add its checksum, fsync, rename.

    Returns the checksum.  A crash at any point leaves either no file or a whole one.
    A failure (a full disk, say) removes the temporary file and raises `OSError`;
    an existing file at `path` is left as it was.

    HDF5 does not survive running out of space in the middle of a file: the handle can
    neither be flushed nor closed, and the library may crash at exit.  So the space is
    checked first (`expected_bytes`, plus a margin), and a small file is built in memory
    with `in_memory=True` and written with plain I/O, where a full disk is an ordinary
    error.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    start = time.monotonic()
    try:
        if in_memory:
            buf = io.BytesIO()
            with h5py.File(buf, "w") as f:
                digest = _fill_and_sign(f, fill)
            data = buf.getbuffer()
            check_space(tmp, len(data))
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        else:
            check_space(tmp, expected_bytes)
            with h5py.File(tmp, "w") as f:
                digest = _fill_and_sign(f, fill)
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
        _warn_if_near_deadline(path, time.monotonic() - start)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, (OSError, RuntimeError)) and not isinstance(exc, CheckpointError):
            # h5py reports a full disk as OSError or RuntimeError, depending on where
            # HDF5 noticed, with a paragraph of HDF5 detail; one short OSError (the
            # cause chained) for callers.
            code = getattr(exc, "errno", None)
            why = os.strerror(code) if code else str(exc).splitlines()[0]
            raise OSError(code, f"{path.name}: {why}") from exc
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return digest


def _fill_and_sign(f: h5py.File, fill: Callable[[h5py.File], None]) -> str:
    fill(f)
    digest = content_checksum(f)
    f.attrs["checksum"] = digest
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
        elif "torch" in sys.modules and isinstance(value, sys.modules["torch"].Tensor):
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
            import torch      # here: a rank without torch never loads algorithm state
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
    except CheckpointError:
        raise
    except Exception as exc:           # h5py raises OSError, KeyError, ValueError... on junk
        raise CheckpointError(f"{path}: unreadable ({exc})") from None


def verify_all(main: Path) -> dict:
    """Verify a main checkpoint file and the replay files it lists; returns its attributes.

    A replay file, or any HDF5 file that is not a main checkpoint, is refused with a
    message saying which file to pass instead."""
    main = Path(main)
    m = _REPLAY_RE.match(main.name)
    if m:
        raise CheckpointError(f"{main}: this is node {m.group(2)}'s replay buffer, not a "
                              f"checkpoint; pass {main.with_name(m.group(1) + '.h5')} (it "
                              f"lists its replay files), or --resume latest")
    attrs = verify(main)
    if "config" not in attrs or "replay_files" not in attrs:
        raise CheckpointError(f"{main}: not a pal_hpc checkpoint (no config); pass a "
                              f"checkpoints/step_<N>.h5 file, or --resume latest")
    for name, digest in json.loads(attrs["replay_files"]).items():
        rattrs = verify(main.with_name(name))
        if rattrs["checksum"] != digest:
            raise CheckpointError(f"{name}: does not belong to {main.name}")
    return attrs


def step_of(main: Path) -> int | None:
    """N of a `step_<N>.h5` file; None for any other name."""
    m = _STEP_RE.match(Path(main).name)
    return int(m.group(1)) if m else None


def list_checkpoints(run_dir) -> list[Path]:
    """Main checkpoint files in `run_dir`, oldest first."""
    d = checkpoint_dir(run_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _STEP_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_valid(run_dir, skipped: list | None = None) -> Path:
    """The newest checkpoint that verifies; warns about each newer one that does not
    (and appends `(path, reason)` for it to `skipped` when given)."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            verify_all(path)
            return path
        except CheckpointError as exc:
            if skipped is not None:
                skipped.append((path, str(exc)))
            warnings.warn(f"skipping checkpoint: {exc}; trying the previous one", stacklevel=2)
    raise CheckpointError(f"no valid checkpoint in {checkpoint_dir(run_dir)}")


def set_aside(main: Path, reason: str, folder: str = DAMAGED) -> Path:
    """Move a checkpoint (and the replay files named after it) into `checkpoints/<folder>/`
    (`damaged/` by default), recording why in `<folder>/REASONS.txt`; returns the new path.
    Set-aside files no longer count as checkpoints of the run, and nothing deletes them."""
    main = Path(main)
    dest = main.parent / folder
    dest.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moved = dest / f"{main.stem}.{stamp}{main.suffix}"
    for extra in main.parent.glob(main.stem + "_replay*.h5"):
        os.replace(extra, dest / f"{extra.stem}.{stamp}{extra.suffix}")
    os.replace(main, moved)
    with open(dest / "REASONS.txt", "a", encoding="utf-8") as fh:
        fh.write(f"{stamp} {main.name}: {reason}\n")
    return moved


class Pruner:
    """Keeps the newest `keep` checkpoints of a run directory that verify.

    Each file is verified once per job (files this job wrote, or resumed from, are
    known good); one that fails is moved aside (`set_aside`), not deleted and not
    counted, so a damaged or junk file never pushes a good one out.  Replay files no
    kept checkpoint lists (left by a failed checkpoint) are deleted."""

    def __init__(self, run_dir, keep: int):
        self.run_dir = Path(run_dir)
        self.keep = max(1, int(keep))
        self._good: dict[Path, tuple[int, int]] = {}     # path -> (size, mtime_ns) verified

    def mark_good(self, main: Path) -> None:
        """Record that `main` (and its replay files) verified or was just written."""
        st = Path(main).stat()
        self._good[Path(main)] = (st.st_size, st.st_mtime_ns)

    def _verified(self, main: Path) -> str:
        """"" if `main` verifies, else the reason."""
        st = main.stat()
        if self._good.get(main) == (st.st_size, st.st_mtime_ns):
            return ""
        try:
            verify_all(main)
        except CheckpointError as exc:
            return str(exc)
        self.mark_good(main)
        return ""

    def prune(self) -> list[str]:
        """Apply the policy; returns one line per file set aside or deleted."""
        notes: list[str] = []
        kept: list[Path] = []
        for main in reversed(list_checkpoints(self.run_dir)):
            if len(kept) < self.keep:
                reason = self._verified(main)
                if reason:
                    moved = set_aside(main, reason)
                    notes.append(f"set aside damaged checkpoint {main.name} -> {moved} "
                                 f"({reason})")
                else:
                    kept.append(main)
                continue
            for extra in main.parent.glob(main.stem + "_replay*.h5"):
                extra.unlink(missing_ok=True)
            main.unlink(missing_ok=True)
            self._good.pop(main, None)
            notes.append(f"deleted old checkpoint {main.name}")
        listed = set()
        for main in kept:
            with h5py.File(main, "r") as f:
                listed.update(json.loads(f.attrs["replay_files"]))
        # Every checkpoint left is in `kept`: a replay file none of them lists is an
        # orphan (of a failed write, or of a step rewritten with a new tag).
        for extra in checkpoint_dir(self.run_dir).glob("step_*_replay*.h5"):
            if extra.name not in listed:
                extra.unlink(missing_ok=True)
        return notes
