"""Offline analysis of runs: a table per run and PNG plots.

    python -m pal_hpc.analyze RUN [RUN ...] [--threshold 475] [--out DIR]

RUN is a run directory (holding `metrics.h5`, and `summary.json`/`config.json` once the
run has ended) or a `metrics.h5` path.  A run still in progress or killed (no
`summary.json`) is analysed from what its metrics log holds so far.

Plots written into --out (default: the run's directory for one run, ./analysis for
several): learning_curve_steps.png, learning_curve_wall.png, throughput.png, and
scaling.png when the runs have at least two different rank counts.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pal_hpc.io.metrics import read_metrics

ACTOR_BIT, LEARNER_BIT = 1, 2      # system stream `role`: 1 actor, 2 learner, 3 both
THROUGHPUT_POINTS = 200            # time grid of throughput.png


@dataclass
class Run:
    """One run's files: its metrics log and, once it ended, its summary."""

    name: str
    dir: Path
    metrics: dict
    summary: dict | None
    config: dict | None


def load_run(path: str | Path) -> Run:
    """Read a run directory or a metrics.h5 path."""
    path = Path(path)
    h5 = path / "metrics.h5" if path.is_dir() else path
    if not h5.is_file():
        raise FileNotFoundError(f"{path}: no metrics.h5 there")
    run_dir = h5.parent
    return Run(name=run_dir.resolve().name, dir=run_dir, metrics=read_metrics(h5),
               summary=_read_json(run_dir / "summary.json"),
               config=_read_json(run_dir / "config.json"))


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


def role_throughput(system: np.ndarray, bit: int, field: str) -> tuple[float | None, int]:
    """Mean over time of `field` per rank with that role bit, summed over those ranks.

    Returns (throughput, number of ranks); throughput is None without samples."""
    rows = system[(system["role"] & bit) != 0]
    ranks = np.unique(rows["rank"])
    if not ranks.size:
        return None, 0
    return float(sum(rows[field][rows["rank"] == r].mean() for r in ranks)), int(ranks.size)


def final_replay_fill(system: np.ndarray) -> float | None:
    """Mean over ranks of each rank's latest replay fill."""
    if not system.size:
        return None
    fills = [system[system["rank"] == r][-1]["replay_fill"] for r in np.unique(system["rank"])]
    return float(np.mean(fills))


def evaluations(run: Run) -> np.ndarray:
    """The evaluation rows in the order they happened."""
    ev = run.metrics["evaluation"]
    return ev[np.argsort(ev["wall_s"], kind="stable")]


def run_stats(run: Run, threshold: float) -> dict:
    """The table's numbers; the summary wins where it has them (the run's final word)."""
    m, summary = run.metrics, run.summary or {}
    streams = [m[s] for s in ("episodes", "learner", "evaluation", "system")]
    steps = [int(a["env_step"].max()) for a in streams if a.size and "env_step" in a.dtype.names]
    walls = [float(a["wall_s"].max()) for a in streams if a.size]
    ev = evaluations(run)
    means = ev["mean_return"]
    hit = np.flatnonzero(means >= threshold)
    final = summary.get("final_eval_return")
    if final is None and means.size:
        final = float(means[-1])
    best = [float(means.max())] if means.size else []
    best += [float(v) for v in (summary.get("best_eval_return"), final) if v is not None]
    actor_tp, n_actors = role_throughput(m["system"], ACTOR_BIT, "env_steps_per_s")
    learner_tp, n_learners = role_throughput(m["system"], LEARNER_BIT, "updates_per_s")
    return {
        "ranks": rank_count(run),
        "env_steps": summary.get("env_steps", max(steps, default=0)),
        "wall_s": summary.get("wall_s", max(walls, default=0.0)),
        "final_eval_return": final,
        "best_eval_return": max(best, default=None),
        "evaluations": int(means.size),
        "steps_to_threshold": int(ev["env_step"][hit[0]]) if hit.size else None,
        "seconds_to_threshold": float(ev["wall_s"][hit[0]]) if hit.size else None,
        "actor_env_steps_per_s": actor_tp, "actor_ranks": n_actors,
        "learner_updates_per_s": learner_tp, "learner_ranks": n_learners,
        "final_replay_fill": final_replay_fill(m["system"]),
        "complete": run.summary is not None,
    }


def _fmt(value, spec: str, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:{spec}}{unit}"


def _ranks(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"


def format_table(run: Run, stats: dict, threshold: float) -> str:
    """A two-column table of one run's numbers."""
    rows = [
        ("status", "complete" if stats["complete"]
         else "in progress or killed (no summary.json)"),
        ("ranks", _fmt(stats["ranks"], "d")),
        ("env steps", _fmt(stats["env_steps"], ",d")),
        ("wall time", _fmt(stats["wall_s"], ".1f", " s")),
        ("evaluations", _fmt(stats["evaluations"], "d")),
        ("final eval return", _fmt(stats["final_eval_return"], ".1f")),
        ("best eval return", _fmt(stats["best_eval_return"], ".1f")),
        (f"env steps to {threshold:g}", _fmt(stats["steps_to_threshold"], ",d")),
        (f"seconds to {threshold:g}", _fmt(stats["seconds_to_threshold"], ".1f", " s")),
        (f"actor env steps/s ({_ranks(stats['actor_ranks'])})",
         _fmt(stats["actor_env_steps_per_s"], ",.1f")),
        # Learners step in lockstep, each on its own batch: summed, this counts the
        # gradient batches computed per second over the job.
        (f"learner gradient batches/s ({_ranks(stats['learner_ranks'])})",
         _fmt(stats["learner_updates_per_s"], ",.1f")),
        ("final replay fill", _fmt(None if stats["final_replay_fill"] is None
                                   else 100 * stats["final_replay_fill"], ".1f", "%")),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"== {run.name}  ({run.dir})"] + [f"  {k:<{width}}  {v}" for k, v in rows]
    return "\n".join(lines)


# -- plots ------------------------------------------------------------------------

def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_learning_curves(runs: list[Run], x: str, threshold: float, path: Path) -> None:
    """Evaluation mean return (± std) against env steps (x="env_step") or wall time."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for run in runs:
        ev = evaluations(run)
        if not ev.size:
            ax.plot([], [], label=f"{run.name} (no evaluations)")
            continue
        line, = ax.plot(ev[x], ev["mean_return"], marker="o", markersize=3, label=run.name)
        ax.fill_between(ev[x], ev["mean_return"] - ev["std_return"],
                        ev["mean_return"] + ev["std_return"], color=line.get_color(), alpha=0.2)
    ax.axhline(threshold, color="grey", linestyle="--", linewidth=1,
               label=f"threshold {threshold:g}")
    ax.set_xlabel("env steps" if x == "env_step" else "wall time (s)")
    ax.set_ylabel("evaluation mean return")
    ax.set_title("Learning curve vs " + ("env steps" if x == "env_step" else "wall time"))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def role_series(system: np.ndarray, bit: int, field: str) -> tuple[np.ndarray, np.ndarray]:
    """`field` summed over the ranks with that role, on a common time grid (each rank's
    samples interpolated, held at its first/last value outside its range)."""
    rows = system[(system["role"] & bit) != 0]
    if not rows.size:
        return np.zeros(0), np.zeros(0)
    grid = np.unique(rows["wall_s"])
    if grid.size > THROUGHPUT_POINTS:
        grid = np.linspace(grid[0], grid[-1], THROUGHPUT_POINTS)
    total = np.zeros_like(grid)
    for r in np.unique(rows["rank"]):
        mine = rows[rows["rank"] == r]
        order = np.argsort(mine["wall_s"], kind="stable")
        total += np.interp(grid, mine["wall_s"][order], mine[field][order])
    return grid, total


def plot_throughput(runs: list[Run], path: Path) -> None:
    """Job-wide env steps/s (actor ranks) and updates/s (learner ranks) over time."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for run in runs:
        for ax, bit, field in ((top, ACTOR_BIT, "env_steps_per_s"),
                               (bottom, LEARNER_BIT, "updates_per_s")):
            t, y = role_series(run.metrics["system"], bit, field)
            ax.plot(t, y, label=run.name)
    top.set_title("Throughput over time (summed over ranks of the role)")
    top.set_ylabel("env steps/s (actors)")
    bottom.set_ylabel("updates/s (learners)")
    bottom.set_xlabel("wall time (s)")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_scaling(runs: list[Run], stats: list[dict], path: Path) -> None:
    """Mean throughput against rank count, one point per run, with linear scaling from
    the smallest run for reference."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, key, label in ((axes[0], "actor_env_steps_per_s", "env steps/s (actors)"),
                           (axes[1], "learner_updates_per_s", "updates/s (learners)")):
        pts = sorted((s["ranks"], s[key], r.name) for r, s in zip(runs, stats)
                     if s["ranks"] and s[key] is not None)
        if pts:
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            ax.plot(xs, ys, "o", markersize=7, label="runs")
            for x, y, name in pts:
                ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4),
                            fontsize=8)
            lin = np.array(sorted(set(xs)), dtype=float)
            ax.set_xticks(lin)
            ax.plot(lin, ys[0] * lin / xs[0], "--", color="grey", label="linear scaling")
        ax.set_xlabel("ranks")
        ax.set_ylabel(label)
        ax.set_title(f"Scaling: {label}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_plots(runs: list[Run], stats: list[dict], threshold: float, out: Path) -> list[Path]:
    """Every plot that applies to these runs; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "learning_curve_steps.png", out / "learning_curve_wall.png",
               out / "throughput.png"]
    plot_learning_curves(runs, "env_step", threshold, written[0])
    plot_learning_curves(runs, "wall_s", threshold, written[1])
    plot_throughput(runs, written[2])
    if len({s["ranks"] for s in stats if s["ranks"]}) >= 2:
        written.append(out / "scaling.png")
        plot_scaling(runs, stats, written[-1])
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pal_hpc.analyze", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="run directory (with metrics.h5) or metrics.h5 path")
    parser.add_argument("--threshold", type=float, default=475.0,
                        help="evaluation mean return that counts as solved (default 475)")
    parser.add_argument("--out", type=Path, default=None,
                        help="directory for the plots (default: the run's directory, or "
                             "./analysis for several runs)")
    args = parser.parse_args(argv)
    try:
        runs = [load_run(p) for p in args.runs]
    except (FileNotFoundError, OSError) as exc:
        parser.error(str(exc))
    stats = [run_stats(r, args.threshold) for r in runs]
    for run, s in zip(runs, stats):
        print(format_table(run, s, args.threshold))
        print()
    out = args.out or (runs[0].dir if len(runs) == 1 else Path("analysis"))
    for path in write_plots(runs, stats, args.threshold, out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
