"""A run's curves in a small file that outlives its log (`--export-curves DIR`).

A run's metrics log holds every episode and every system row: tens of MB for a
MinAtar run of 5M frames, more than belongs in a repository, and gone with the
machine it ran on.  What comparing runs needs is much less: the greedy evaluations,
the training return's rolling mean (thinned to at most CURVE_POINTS points), the
config, the summary and the layout.  `export_curves` writes those as JSON
(`<run name>.curves.json`, about 100 kB); `load_curves` reads one back as a `Run`
that every table, plot, reference and `--seeds` takes as it takes a run directory
(its throughput streams are empty: the file does not keep them).  Loading parses
JSON only: nothing in the file is executed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pal_hpc.analyze.runs import TRAIN_WINDOW, Run, evaluations, run_config, training_returns
from pal_hpc.io.schema import EPISODES, EVALUATION, LEARNER, SYSTEM

FORMAT, VERSION = "pal_hpc.curves", 1
SUFFIX = ".curves.json"
CURVE_POINTS = 2000
TRAINING = np.dtype([("env_step", np.int64), ("wall_s", np.float64),
                     ("mean_return", np.float64)])


class CurvesReadError(OSError):
    """A curves file that cannot be read; the message names the file and why."""


def _thin(rows: np.ndarray, points: int) -> np.ndarray:
    """At most `points` rows, evenly spaced by index, the first and the last kept."""
    if len(rows) <= points:
        return rows
    return rows[np.unique(np.linspace(0, len(rows) - 1, points).round().astype(int))]


def _columns(rows: np.ndarray, digits: dict[str, int]) -> dict[str, list]:
    return {name: (np.round(rows[name], digits[name]) if name in digits else rows[name]).tolist()
            for name in rows.dtype.names}


def export_curves(run: Run, out_dir: Path, points: int = CURVE_POINTS) -> Path:
    """Write `run`'s curves to out_dir/<run name>.curves.json; returns the path."""
    train = training_returns(run, by="env_step")
    train_rows = np.zeros(0, TRAINING) if train is None else _thin(train, points)
    doc = {
        "format": FORMAT, "version": VERSION, "name": run.name,
        "config": run_config(run), "summary": run.summary,
        "layout": run.metrics["attrs"].get("layout"),
        "training_window": TRAIN_WINDOW,
        "evaluation": _columns(evaluations(run), {"wall_s": 3, "mean_return": 4,
                                                  "std_return": 4}),
        "training": _columns(train_rows.astype(TRAINING), {"wall_s": 3, "mean_return": 4}),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{run.name}{SUFFIX}"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    tmp.replace(path)                    # a reader never sees half a file
    return path


def _table(doc: dict, key: str, dtype: np.dtype, path: Path) -> np.ndarray:
    cols = doc.get(key)
    if not isinstance(cols, dict) or set(cols) != set(dtype.names):
        raise CurvesReadError(f"{path}: {key!r} must have the columns "
                              f"{', '.join(dtype.names)}")
    lengths = {len(v) if isinstance(v, list) else -1 for v in cols.values()}
    if len(lengths) != 1 or -1 in lengths:
        raise CurvesReadError(f"{path}: {key!r} columns must be lists of one length")
    out = np.zeros(lengths.pop(), dtype)
    try:
        for name in dtype.names:
            out[name] = np.asarray(cols[name], dtype=dtype[name])
    except (TypeError, ValueError) as exc:
        raise CurvesReadError(f"{path}: {key!r} holds a value that is not a number "
                              f"({exc})") from None
    return out


def load_curves(path: str | Path) -> Run:
    """A curves file as a `Run`; CurvesReadError naming the file when it is not one."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CurvesReadError(f"{path}: not a readable curves file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CurvesReadError(f"{path}: not a pal_hpc curves file (no \"format\": "
                              f"\"{FORMAT}\")")
    if doc.get("version") != VERSION:
        raise CurvesReadError(f"{path}: curves format version {doc.get('version')!r}; "
                              f"this pal_hpc reads version {VERSION}")
    ev = _table(doc, "evaluation", EVALUATION, path)
    train = _table(doc, "training", TRAINING, path)
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    summary = doc.get("summary") if isinstance(doc.get("summary"), dict) else None
    layout = doc.get("layout") if isinstance(doc.get("layout"), dict) else None
    metrics = {"attrs": {"config": config, "layout": layout} if layout else {"config": config},
               "evaluation": ev, "training": train, "episodes": np.zeros(0, EPISODES),
               "learner": np.zeros(0, LEARNER), "system": np.zeros(0, SYSTEM)}
    name = str(doc.get("name") or path.name.removesuffix(SUFFIX))
    return Run(name=name, dir=path.parent, metrics=metrics, summary=summary, config=config)
