"""One run's numbers (run_stats: steps, time, returns, time to the threshold,
throughput by role, the planner's prediction) and the two-column table that prints
them (format_table)."""

from __future__ import annotations

import math

import numpy as np

from pal_hpc.analyze.runs import (ACTOR_BIT, LEARNER_BIT, Run, evaluations,
                                  onpolicy_layout, rank_count)


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


def format_table(run: Run, stats: dict, threshold: float | None,
                 extra: list[tuple[str, str]] = ()) -> str:
    """A two-column table of one run's numbers, then the `extra` rows (the
    references')."""
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
    rows += list(extra)
    width = max(len(k) for k, _ in rows)
    lines = [f"== {run.name}  ({run.dir})"] + [f"  {k:<{width}}  {v}" for k, v in rows]
    return "\n".join(lines)
