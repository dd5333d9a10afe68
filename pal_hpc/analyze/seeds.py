"""Runs of one setting over several seeds, as one curve: their mean and their spread
on a common grid of env steps (`--seeds`).

A paper's curve is a mean over seeds (the MinAtar paper's over 30, CleanRL's over 3);
one run beside it says little (docs/minatar.md).  Each run's training return (the
rolling mean of its last episodes) and its greedy evaluations are interpolated linearly
onto SEED_GRID_POINTS env-step points over the steps every run covers, then averaged;
the band is the runs' lowest to highest value at each point.  Which runs are seeds of
one setting is the user's call; settings that differ beyond the seed and the
bookkeeping (CONFIG_BOOKKEEPING) are named in a warning.
"""

from __future__ import annotations

import numpy as np

from pal_hpc.analyze.plots import draw_references, pyplot
from pal_hpc.analyze.runs import Run, evaluations, run_config, training_returns

SEED_GRID_POINTS = 200
# Config fields that say where and how long a run goes, not what it learns.
CONFIG_BOOKKEEPING = frozenset({
    "seed", "run_dir", "resume", "overwrite", "wall_time", "total_steps", "checkpoint_every",
    "checkpoint_replay", "keep_checkpoints", "progress_every", "tensorboard", "eval_every",
    "eval_episodes", "eval_max_steps", "peer_timeout", "target_return"})


def differing_settings(runs: list[Run]) -> list[str]:
    """Config fields (beyond CONFIG_BOOKKEEPING) whose values differ between the runs."""
    configs = [run_config(r) for r in runs]
    keys = set().union(*configs) - CONFIG_BOOKKEEPING
    return sorted(k for k in keys if len({repr(c.get(k)) for c in configs}) > 1)


def _on_grid(xs: list[np.ndarray], ys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Each (x, y) curve interpolated onto a grid over the x range all of them cover."""
    lo, hi = max(float(x[0]) for x in xs), min(float(x[-1]) for x in xs)
    if not hi > lo:
        return np.zeros(0), np.zeros((len(xs), 0))
    grid = np.linspace(lo, hi, SEED_GRID_POINTS)
    return grid, np.stack([np.interp(grid, x, y) for x, y in zip(xs, ys)])


def seed_curves(runs: list[Run]) -> dict:
    """{"training": (grid, values per run), "evaluation": (grid, values per run)}, each
    present when at least two runs have that curve and they overlap in env steps."""
    out = {}
    train = [training_returns(r, by="env_step") for r in runs]
    train = [t for t in train if t is not None and len(t) > 1]
    if len(train) >= 2:
        grid, values = _on_grid([t["env_step"].astype(float) for t in train],
                                [t["mean_return"] for t in train])
        if grid.size:
            out["training"] = (grid, values)
    evs = [evaluations(r) for r in runs]
    evs = [e[np.argsort(e["env_step"], kind="stable")] for e in evs if e.size > 1]
    if len(evs) >= 2:
        grid, values = _on_grid([e["env_step"].astype(float) for e in evs],
                                [e["mean_return"].astype(float) for e in evs])
        if grid.size:
            out["evaluation"] = (grid, values)
    return out


def seed_rows(curves: dict) -> list[str]:
    """The curves' last points as text: mean (lowest .. highest) at the steps every run
    reached."""
    lines = []
    for name, label in (("training", "training return"), ("evaluation", "greedy evaluation")):
        if name in curves:
            grid, values = curves[name]
            last = values[:, -1]
            lines.append(f"- {label} at {int(grid[-1]):,} env steps: mean {last.mean():.1f} "
                         f"({last.min():.1f} .. {last.max():.1f}) over {len(last)} runs")
    return lines


def plot_seeds(runs: list[Run], curves: dict, path, references=()) -> None:
    """The mean of the runs' curves with their lowest-to-highest band: greedy
    evaluations solid, training returns dashed; the references as on the other plots."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    names = ", ".join(r.name for r in runs)
    for name, style, colour, label in (
            ("evaluation", "-", "tab:blue", "greedy evaluations"),
            ("training", "--", "tab:orange", "training return (mean of last 100 episodes)")):
        if name not in curves:
            continue
        grid, values = curves[name]
        ax.plot(grid, values.mean(axis=0), style, color=colour,
                label=f"{label}: mean of {len(values)} runs")
        ax.fill_between(grid, values.min(axis=0), values.max(axis=0), color=colour, alpha=0.2,
                        label=f"{label}: lowest to highest run")
    draw_references(ax, list(references), "env_step")
    ax.set_xlabel("env steps")
    ax.set_ylabel("mean return")
    ax.set_title(f"Over seeds: {names}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
