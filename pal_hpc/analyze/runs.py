"""Reading a run for analysis: its files (every log segment, the summary, the config),
what its config and layout say, and its streams in order (evaluations, the training
episodes' rolling mean return)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pal_hpc.io.metrics import FIRST_SEGMENT, log_segments, read_metrics, read_run_metrics

ACTOR_BIT, LEARNER_BIT = 1, 2      # system stream `role`: 1 actor, 2 learner, 3 both
TRAIN_WINDOW = 100                 # episodes in the training-return rolling mean


@dataclass
class Run:
    """One run's files: its metrics log (all segments) and, once it ended, its summary."""

    name: str
    dir: Path
    metrics: dict
    summary: dict | None
    config: dict | None


def load_run(path: str | Path) -> Run:
    """Read a run directory (every log segment) or a metrics file.

    Raises OSError (FileNotFoundError, MetricsReadError) naming the file it could
    not read."""
    path = Path(path)
    if path.is_dir():
        run_dir, metrics = path, read_run_metrics(path)
    elif path.is_file():
        run_dir = path.parent
        # A run's own log file stands for the whole run, segments included.
        metrics = read_run_metrics(run_dir) if path in log_segments(run_dir) \
            else read_metrics(path)
    else:
        raise FileNotFoundError(f"{path}: no such run directory or {FIRST_SEGMENT}")
    return Run(name=run_dir.resolve().name, dir=run_dir, metrics=metrics,
               summary=_read_json(run_dir / "summary.json"),
               config=_read_json(run_dir / "config.json"))


def run_config(run: Run) -> dict:
    """The run's config: the log's copy, updated by config.json where the run wrote one."""
    logged = run.metrics["attrs"].get("config")
    return {**(logged if isinstance(logged, dict) else {}), **(run.config or {})}


def group_key(run: Run) -> tuple[str, str]:
    """(algorithm, environment) of the run; "?" where the config does not say."""
    cfg = run_config(run)
    return str(cfg.get("algo") or "?"), str(cfg.get("env") or "?")


def group_runs(runs: list[Run]) -> dict[tuple[str, str], list[Run]]:
    """Runs by (algorithm, environment), in the order the groups first appear."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault(group_key(run), []).append(run)
    return groups


def run_threshold(run: Run, default: float | None) -> float | None:
    """The return that counts as solved: the run's target_return, else `default`."""
    target = run_config(run).get("target_return")
    return float(target) if isinstance(target, (int, float)) else default


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def rank_count(run: Run) -> int | None:
    """Ranks of the job: the layout attribute, else the summary, else None."""
    layout = run.metrics["attrs"].get("layout")
    if isinstance(layout, dict) and layout.get("ranks"):
        return int(layout["ranks"])
    if run.summary and run.summary.get("ranks"):
        return int(run.summary["ranks"])
    return None


def onpolicy_layout(run: Run) -> tuple[int, int] | None:
    """(masters, env workers) of an on-policy (PAAC) run, from its log's layout; None
    for a run of actors and learners."""
    layout = run.metrics["attrs"].get("layout")
    if isinstance(layout, dict) and "masters" in layout:
        return int(layout["masters"]), int(layout.get("env_workers") or 0)
    return None


def evaluations(run: Run) -> np.ndarray:
    """The evaluation rows in the order they happened."""
    ev = run.metrics["evaluation"]
    return ev[np.argsort(ev["wall_s"], kind="stable")]


def training_returns(run: Run, window: int = TRAIN_WINDOW, by: str = "wall_s"
                     ) -> np.ndarray | None:
    """The rolling mean of the last `window` training episodes' returns at each episode
    end, as rows (env_step, wall_s, mean_return) in the order of `by` ("wall_s": the
    order they ended; "env_step": the job's env step at their end, which rows from
    different actors reach in another order), the other as the tie-break; None without
    episodes.  Smoother than a few greedy evaluations, but of the exploring policy.
    A run read from a curves file (`pal_hpc.analyze.curves`) has these rows already,
    thinned, at the file's window."""
    other = {"wall_s": "env_step", "env_step": "wall_s"}[by]
    kept = run.metrics.get("training")
    if kept is not None:
        return kept[np.lexsort((kept[other], kept[by]))] if len(kept) else None
    ep = run.metrics.get("episodes")
    if ep is None or not len(ep):
        return None
    ep = ep[np.lexsort((ep[other], ep[by]))]
    ret = ep["return"].astype(np.float64)
    csum = np.concatenate([[0.0], np.cumsum(ret)])
    idx = np.arange(1, len(ret) + 1)
    lo = np.maximum(idx - window, 0)
    out = np.empty(len(ret), dtype=[("env_step", "i8"), ("wall_s", "f8"),
                                    ("mean_return", "f8")])
    out["env_step"], out["wall_s"] = ep["env_step"], ep["wall_s"]
    out["mean_return"] = (csum[idx] - csum[lo]) / (idx - lo)
    return out
