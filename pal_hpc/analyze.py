"""Offline analysis of runs: a table per run and PNG plots.

    python -m pal_hpc.analyze RUN [RUN ...] [--threshold R] [--out DIR]

RUN is a run directory (holding `metrics.h5`, maybe more log segments `metrics.1.h5`...,
and `summary.json`/`config.json` once the run has ended) or a `metrics.h5` path.  A run
still in progress or killed (no `summary.json`) is analysed from what its log holds so
far.  A RUN that cannot be read is reported, naming the file; the others are still
analysed and the exit status is 1.

Runs are grouped by (algorithm, environment).  A run counts as solved at its config's
`target_return`; --threshold applies to runs without one.

Plots written into --out (default: the run's directory for one run, ./analysis for
several), in a subdirectory per group when there are several groups:
learning_curve_steps.png, learning_curve_wall.png, throughput.png, and scaling.png when
the group's runs have at least two different rank counts (with the planner's prediction
beside each run that was planned at start-up, `--actors-per-node auto`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pal_hpc.io.metrics import FIRST_SEGMENT, log_segments, read_metrics, read_run_metrics

ACTOR_BIT, LEARNER_BIT = 1, 2      # system stream `role`: 1 actor, 2 learner, 3 both
THROUGHPUT_POINTS = 200            # time grid of throughput.png


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


TRAIN_WINDOW = 100                 # episodes in the training-return rolling mean


def training_returns(run: Run, window: int = TRAIN_WINDOW, by: str = "wall_s"
                     ) -> np.ndarray | None:
    """The rolling mean of the last `window` training episodes' returns at each episode
    end, as rows (env_step, wall_s, mean_return) in the order of `by` ("wall_s": the
    order they ended; "env_step": the job's env step at their end, which rows from
    different actors reach in another order), the other as the tie-break; None without
    episodes.  Smoother than a few greedy evaluations, but of the exploring policy."""
    ep = run.metrics.get("episodes")
    if ep is None or not len(ep):
        return None
    other = {"wall_s": "env_step", "env_step": "wall_s"}[by]
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


def run_stats(run: Run, threshold: float | None) -> dict:
    """The table's numbers; the summary wins where it has them (the run's final word)."""
    m, summary = run.metrics, run.summary or {}
    streams = [m[s] for s in ("episodes", "learner", "evaluation", "system")]
    steps = [int(a["env_step"].max()) for a in streams if a.size and "env_step" in a.dtype.names]
    walls = [float(a["wall_s"].max()) for a in streams if a.size]
    ev = evaluations(run)
    means = ev["mean_return"]
    hit = np.flatnonzero(means >= threshold) if threshold is not None else means[:0]
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
        "segments": len(m.get("segments", [None])),
        "unreadable": [p.name for p in m.get("unreadable", {})],
        "onpolicy": onpolicy_layout(run),
        "predicted": planned_rates(summary),
    }


def onpolicy_layout(run: Run) -> tuple[int, int] | None:
    """(masters, env workers) of an on-policy (PAAC) run, from its log's layout; None
    for a run of actors and learners."""
    layout = run.metrics["attrs"].get("layout")
    if isinstance(layout, dict) and "masters" in layout:
        return int(layout["masters"]), int(layout.get("env_workers") or 0)
    return None


def planned_rates(summary: dict) -> dict:
    """The start-up planner's prediction (runs with --actors/--learners-per-node auto),
    under the keys of the measured throughputs it predicts; {} without a plan."""
    plan = summary.get("plan")
    if not isinstance(plan, dict) or "env_steps_per_s" not in plan:
        return {}
    return {"actor_env_steps_per_s": float(plan["env_steps_per_s"]),
            "learner_updates_per_s": float(plan["gradient_batches_per_s"]),
            "split": str(plan.get("describe", ""))}


def _fmt(value, spec: str, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:{spec}}{unit}"


def _ranks(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"


def _onpolicy_rows(stats: dict) -> list[tuple[str, str]]:
    """Throughput rows of an on-policy run: its masters log the system rows (each its
    node's env steps/s and its updates/s), its env workers none; there is no replay."""
    masters, workers = stats["onpolicy"]
    who = f"{masters} master{'s' * (masters != 1)}, {workers} env worker{'s' * (workers != 1)}"
    return [(f"env steps/s ({who})", _fmt(stats["actor_env_steps_per_s"], ",.1f")),
            # Masters update in lockstep, each on its node's rollout: summed, this
            # counts the gradient batches computed per second over the job.
            (f"master gradient batches/s ({masters} master{'s' * (masters != 1)})",
             _fmt(stats["learner_updates_per_s"], ",.1f"))]


def format_table(run: Run, stats: dict, threshold: float | None) -> str:
    """A two-column table of one run's numbers."""
    target = f"{threshold:g}" if threshold is not None else "threshold (none given)"
    rows = [
        ("status", "complete" if stats["complete"]
         else "in progress or killed (no summary.json)"),
        ("ranks", _fmt(stats["ranks"], "d")),
        ("env steps", _fmt(stats["env_steps"], ",d")),
        ("wall time", _fmt(stats["wall_s"], ".1f", " s")),
        ("evaluations", _fmt(stats["evaluations"], "d")),
        ("final eval return", _fmt(stats["final_eval_return"], ".1f")),
        ("best eval return", _fmt(stats["best_eval_return"], ".1f")),
        (f"env steps to {target}", _fmt(stats["steps_to_threshold"], ",d")),
        (f"seconds to {target}", _fmt(stats["seconds_to_threshold"], ".1f", " s")),
    ]
    rows += _onpolicy_rows(stats) if stats.get("onpolicy") else [
        (f"actor env steps/s ({_ranks(stats['actor_ranks'])})",
         _fmt(stats["actor_env_steps_per_s"], ",.1f")),
        # Learners step in lockstep, each on its own batch: summed, this counts the
        # gradient batches computed per second over the job.
        (f"learner gradient batches/s ({_ranks(stats['learner_ranks'])})",
         _fmt(stats["learner_updates_per_s"], ",.1f")),
        ("final replay fill", _fmt(None if stats["final_replay_fill"] is None
                                   else 100 * stats["final_replay_fill"], ".1f", "%")),
    ]
    plan = stats.get("predicted") or {}
    if plan:
        rows.append(("planner's prediction", f"{plan['actor_env_steps_per_s']:,.1f} env "
                     f"steps/s, {plan['learner_updates_per_s']:,.1f} gradient batches/s "
                     f"({plan['split']})"))
    if stats["segments"] > 1 or stats["unreadable"]:
        skipped = f" ({len(stats['unreadable'])} unreadable: " \
                  f"{', '.join(stats['unreadable'])})" if stats["unreadable"] else ""
        rows.append(("log segments", f"{stats['segments']}{skipped}"))
    width = max(len(k) for k, _ in rows)
    lines = [f"== {run.name}  ({run.dir})"] + [f"  {k:<{width}}  {v}" for k, v in rows]
    return "\n".join(lines)


# -- plots ------------------------------------------------------------------------

def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_learning_curves(runs: list[Run], x: str, thresholds: list[float | None],
                         path: Path) -> None:
    """Evaluation mean return (± std) against env steps (x="env_step") or wall time,
    the training episodes' rolling mean return as a thin dashed line of the same
    colour, and a line at each run's threshold."""
    plt = _pyplot()
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
    ax.set_xlabel("env steps" if x == "env_step" else "wall time (s)")
    ax.set_ylabel("mean return (greedy evaluations; dashed: training episodes)")
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
    the smallest run for reference and, for runs planned at start-up, the planner's
    prediction."""
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
                out: Path) -> list[Path]:
    """Every plot that applies to these runs (one group); returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "learning_curve_steps.png", out / "learning_curve_wall.png",
               out / "throughput.png"]
    plot_learning_curves(runs, "env_step", thresholds, written[0])
    plot_learning_curves(runs, "wall_s", thresholds, written[1])
    plot_throughput(runs, written[2])
    if len({s["ranks"] for s in stats if s["ranks"]}) >= 2:
        written.append(out / "scaling.png")
        plot_scaling(runs, stats, written[-1])
    return written


def group_runs(runs: list[Run]) -> dict[tuple[str, str], list[Run]]:
    """Runs by (algorithm, environment), in the order the groups first appear."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault(group_key(run), []).append(run)
    return groups


def _load_all(paths: list[str]) -> tuple[list[Run], int]:
    """The runs that could be read; each one that could not is reported on stderr.
    Returns (runs, number of failures)."""
    runs, failed = [], 0
    for path in paths:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                runs.append(load_run(path))
            except OSError as exc:      # its message names the file and says why
                print(f"error: {exc}", file=sys.stderr)
                failed += 1
                continue
        for w in caught:                 # segments skipped in a run that was read
            print(f"warning: {w.message}", file=sys.stderr)
    return runs, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pal_hpc.analyze", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="run directory (with metrics.h5) or metrics.h5 path")
    parser.add_argument("--threshold", type=float, default=None,
                        help="evaluation mean return that counts as solved, for runs whose "
                             "config has no target_return (default: none)")
    parser.add_argument("--out", type=Path, default=None,
                        help="directory for the plots (default: the run's directory, or "
                             "./analysis for several runs)")
    args = parser.parse_args(argv)
    runs, failed = _load_all(args.runs)
    status = 1 if failed else 0
    if not runs:
        return status
    groups = group_runs(runs)
    out_root = args.out or (runs[0].dir if len(runs) == 1 else Path("analysis"))
    for (algo, env), group in groups.items():
        if len(groups) > 1:
            print(f"### {algo} on {env}: {len(group)} run{'s' * (len(group) > 1)}\n")
        thresholds = [run_threshold(r, args.threshold) for r in group]
        stats = [run_stats(r, t) for r, t in zip(group, thresholds)]
        for run, s, t in zip(group, stats, thresholds):
            print(format_table(run, s, t))
            print()
        out = out_root if len(groups) == 1 else out_root / f"{algo}-{env}".replace("/", "-")
        try:
            for path in write_plots(group, stats, thresholds, out):
                print(f"wrote {path}")
        except OSError as exc:
            hint = "" if args.out else "; pass --out DIR to write them elsewhere"
            print(f"error: cannot write the plots to {out} "
                  f"({exc.strerror or exc}){hint}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
