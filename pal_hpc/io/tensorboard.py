"""TensorBoard event files beside the HDF5 metrics log (`--tensorboard`).

Rank 0 hands every block of rows it appends to the HDF5 log (`pal_hpc.io.metrics`,
through `pal_hpc.runtime.telemetry`) to a `TensorBoardMirror` too, which writes them as
scalars into `<run dir>/tensorboard/` and flushes when the HDF5 log flushes, so the
event files follow the run live.  The HDF5 log stays the record; the event files are a
view of it for the tool everyone already runs (`tensorboard --logdir RUN/tensorboard`).

One scalar per column of each row, tagged `<stream>/<column>`:
- `episodes/return`, `episodes/length`, at the episode's env step;
- `learner/update` and `learner/<metric>` (the algorithm's metric names), at the env step;
- `evaluation/mean_return`, `std_return`, `episodes`, at the env step;
- `system/<column>/rank<r>` (env steps/s, updates/s, replay fill, latencies, RSS) per
  rank, at the milliseconds since the run started.

Every event's wall time is the row's own (`wall_s` after the run's start).  NaN cells
(a column that does not apply to a rank) are left out.  TensorBoard's readers take a
step that does not increase as a restarted run and drop the points at and after it, so
the rows of a block are written in step order and a step is raised, when needed, to one
past the previous step of its stream (per rank for `system`): episodes from several
actors arrive out of env-step order.  A resumed run starts again at the checkpoint's
steps, so TensorBoard drops what a killed attempt logged after its checkpoint, as
`read_run_metrics` does.

Importing this module imports no tensorboard; only `TensorBoardMirror` does.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np

from pal_hpc.io.rundir import probe_write
from pal_hpc.options import ConfigError

SUBDIR = "tensorboard"
# Columns that place a row rather than measure something.
_PLACING = {"env_step", "wall_s", "rank", "role", "actor"}


def check_tensorboard_dir(run_dir: str | Path) -> Path:
    """Before any work: tensorboard is installed and `<run_dir>/tensorboard` can be
    created and written.  Returns the directory; raises ConfigError naming the problem."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("tensorboard: --tensorboard needs the tensorboard package "
                          "(pip install -r requirements-tensorboard.txt, or .[tensorboard])")
    path = Path(run_dir) / SUBDIR
    if path.exists() and not path.is_dir():
        raise ConfigError(f"tensorboard: {path} is a file, but the event files go into a "
                          f"directory of that name; move it away or drop --tensorboard")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe_write(path)
    except OSError as exc:
        raise ConfigError(f"tensorboard: {path} cannot be written ({exc.strerror or exc}); "
                          f"give a writable --run-dir or drop --tensorboard") from None
    return path


class TensorBoardMirror:
    """Rank 0's writer of the log's rows as TensorBoard scalars (see the module doc).

    `wall_s_now` is the run's clock (seconds since it started, a resumed run's included)
    at the moment of opening: it maps the rows' `wall_s` onto wall-clock time."""

    def __init__(self, log_dir: str | Path, wall_s_now: float, flush_secs: float = 5.0):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.epoch = time.time() - wall_s_now       # wall-clock time at the run's wall_s 0
        self._writer = SummaryWriter(log_dir=str(self.log_dir),
                                     flush_secs=max(1, int(flush_secs)))
        self._last: dict[tuple, int] = {}           # (stream, rank) -> last step written
        self.scalars = 0                            # written so far

    def write(self, stream: str, rows: np.ndarray) -> None:
        """Write one block of `stream`'s rows (a structured array of the log's dtype)."""
        names = rows.dtype.names
        values = [n for n in names if n not in _PLACING]
        if "env_step" in names:
            steps = rows["env_step"].astype(np.int64)
        else:
            steps = np.round(rows["wall_s"] * 1e3).astype(np.int64)
        ranks = rows["rank"] if "rank" in names else np.full(len(rows), -1)
        for i in np.argsort(steps, kind="stable"):
            rank = int(ranks[i])
            key = (stream, rank)
            step = max(int(steps[i]), self._last.get(key, -1) + 1)
            self._last[key] = step
            suffix = f"/rank{rank}" if rank >= 0 else ""
            wall = self.epoch + float(rows["wall_s"][i])
            for name in values:
                v = float(rows[name][i])
                if not np.isnan(v):
                    self._writer.add_scalar(f"{stream}/{name}{suffix}", v, step, walltime=wall)
                    self.scalars += 1

    def flush(self) -> None:
        """Make everything written so far readable in the event file."""
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file; closing twice is harmless."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def open_mirror(cfg, wall_s_now: float, flush_secs: float = 5.0) -> TensorBoardMirror | None:
    """Rank 0: the run's mirror when `cfg.tensorboard` is set, else None (and no import)."""
    if not cfg.tensorboard:
        return None
    return TensorBoardMirror(Path(cfg.resolved_run_dir()) / SUBDIR, wall_s_now, flush_secs)
