"""The PNG plots of a group of runs: learning curves against env steps and wall time,
throughput over time by role, and scaling against the rank count (write_plots writes
every one that applies).  matplotlib is imported only when a plot is drawn."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pal_hpc.analyze.references import Reference
from pal_hpc.analyze.runs import (ACTOR_BIT, LEARNER_BIT, TRAIN_WINDOW, Run, evaluations,
                                  training_returns)

THROUGHPUT_POINTS = 200            # time grid of throughput.png


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_learning_curves(runs: list[Run], x: str, thresholds: list[float | None],
                         path: Path, references: list[Reference] = ()) -> None:
    """Evaluation mean return (± std) against env steps (x="env_step") or wall time,
    the training episodes' rolling mean return as a thin dashed line of the same
    colour, a line at each run's threshold, and the published `references`: a dotted
    level each, and against env steps a star (± its spread) where it was reported."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for run in runs:
        ev = evaluations(run)
        train = training_returns(run, by=x)       # x grows along the dashed line
        if not ev.size:
            line, = ax.plot([], [], label=f"{run.name} (no evaluations)")
        else:
            line, = ax.plot(ev[x], ev["mean_return"], marker="o", markersize=3,
                            label=run.name)
            ax.fill_between(ev[x], ev["mean_return"] - ev["std_return"],
                            ev["mean_return"] + ev["std_return"], color=line.get_color(),
                            alpha=0.2)
        if train is not None:
            ax.plot(train[x], train["mean_return"], color=line.get_color(), linestyle="--",
                    linewidth=0.8, alpha=0.8,
                    label=f"{run.name} training (mean of last {TRAIN_WINDOW} episodes)")
    for threshold in sorted({t for t in thresholds if t is not None}):
        ax.axhline(threshold, color="grey", linestyle="--", linewidth=1,
                   label=f"threshold {threshold:g}")
    draw_references(ax, references, x)
    ax.set_xlabel("env steps" if x == "env_step" else "wall time (s)")
    ax.set_ylabel("mean return (greedy evaluations; dashed: training episodes)")
    ax.set_title("Learning curve vs " + ("env steps" if x == "env_step" else "wall time"))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


REFERENCE_COLOURS = ("black", "tab:purple", "tab:brown", "tab:olive")


def draw_references(ax, references: list[Reference], x: str) -> None:
    for i, ref in enumerate(references):
        colour = REFERENCE_COLOURS[i % len(REFERENCE_COLOURS)]
        ax.axhline(ref.value, color=colour, linestyle=":", linewidth=1.2,
                   label=f"{ref.label}: {ref.describe()}")
        if x == "env_step" and ref.steps is not None:
            ax.errorbar([ref.steps], [ref.value], yerr=None if ref.spread is None
                        else [[ref.spread], [ref.spread]], fmt="*", markersize=14,
                        color=colour, capsize=5, zorder=5)


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
    plt = pyplot()
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
    the smallest run for reference and, for runs planned at start-up, the planner's
    prediction."""
    plt = pyplot()
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
        predicted = sorted((s["ranks"], s["predicted"][key]) for s in stats
                           if s["ranks"] and key in (s.get("predicted") or {}))
        if predicted:
            ax.plot([p[0] for p in predicted], [p[1] for p in predicted], "x",
                    markersize=9, color="tab:red", label="planner's prediction")
        ax.set_xlabel("ranks")
        ax.set_ylabel(label)
        ax.set_title(f"Scaling: {label}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_plots(runs: list[Run], stats: list[dict], thresholds: list[float | None],
                out: Path, references: list[Reference] = ()) -> list[Path]:
    """Every plot that applies to these runs (one group), the learning curves with the
    group's `references`; throughput and scaling only where a run has its system rows
    (a curves file has none).  Returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "learning_curve_steps.png", out / "learning_curve_wall.png"]
    plot_learning_curves(runs, "env_step", thresholds, written[0], references)
    plot_learning_curves(runs, "wall_s", thresholds, written[1], references)
    measured = any(len(run.metrics["system"]) for run in runs)   # curves files keep none
    if measured:
        written.append(out / "throughput.png")
        plot_throughput(runs, written[-1])
    if measured and len({s["ranks"] for s in stats if s["ranks"]}) >= 2:
        written.append(out / "scaling.png")
        plot_scaling(runs, stats, written[-1])
    return written
