"""The end of a run: the summary rank 0 prints and writes (`summary.json`, `config.json`).

`Summary` is a part of `RankRun` (a mixin) that reads the rank's coordinator, counters
and layout."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from pal_hpc.config_io import config_to_dict
from pal_hpc.io.schema import EVALUATION
from pal_hpc.runtime import signals
from pal_hpc.runtime import stats as S


class Summary:
    """The summary method of `RankRun` (see the module docstring)."""

    def _summary(self, totals: np.ndarray, final_eval: np.ndarray, identical: bool,
                 checkpoint: str) -> dict:
        cfg, coord = self.cfg, self.coord
        wall = time.monotonic() - self.start
        coord.observe(totals)           # episodes and evaluations since the last round
        final_mean = float(final_eval[0] / final_eval[1]) if final_eval[1] else None
        if final_mean is not None:
            self.telemetry.write_now("evaluation", np.array(
                [(int(totals[S.ENV_STEPS]), wall, final_mean, np.nan, int(final_eval[1]))],
                dtype=EVALUATION))
        means = [e["mean_return"] for e in coord.evals]
        means += [final_mean] if final_mean is not None else []
        hit = coord.target_hit
        if hit is None and final_mean is not None and cfg.target_return is not None \
                and final_mean >= cfg.target_return:
            hit = {"env_steps": int(totals[S.ENV_STEPS]), "wall_s": round(wall, 3)}
        summary = {
            "algo": cfg.algo, "env": cfg.env, "seed": cfg.seed,
            "env_steps": int(totals[S.ENV_STEPS]), "updates": int(totals[S.UPDATES]),
            "episodes": int(totals[S.EPISODES]),
            "wall_s": round(wall, 3),
            "best_eval_return": max(means) if means else None,
            "final_eval_return": final_mean,
            "time_to_target_s": hit["wall_s"] if hit else None,
            # The same without the time the evaluator spent evaluating up to the hit
            # (what benchmarks against peers that do not count theirs compare).
            "time_to_target_excl_eval_s": (
                round(hit["wall_s"] - sum(e.get("eval_s", 0.0) for e in coord.evals
                                          if e["env_steps"] <= hit["env_steps"]), 3)
                if hit else None),
            "steps_to_target": hit["env_steps"] if hit else None,
            "target_return": cfg.target_return,
            "ranks": self.world.Get_size(), "nodes": self.topo.n_nodes,
            # The hosts the ranks ran on (MPI's processor names), in order of first rank.
            "hosts": list(dict.fromkeys(getattr(self, "hosts", None) or [])),
            # Each host's CPU (model, vector instructions, CPUs it may use): which machine
            # a run's speed came from.
            "cpus": dict(getattr(self, "cpus", None) or {}),
            "actors": self.n_actors, "learners": self.n_learners,
            # The ranks that imported torch: the learners, and actors whose algorithm
            # has no numpy policy (`AlgoSpec.numpy_policy`); on-policy, the masters.
            "ranks_with_torch": getattr(self, "torch_ranks", None),
            "learner_params_identical": identical,
            "checkpoint": checkpoint,       # None: the final checkpoint failed
            "resumed_from": self.resumed_from or None,
            "params_digest_at_start": self.start_digest or None,
            # The learners' final parameters (SHA-256, Algorithm.digest): with --schedule
            # sync, the same for one seed and layout run after run.
            "params_digest": getattr(self, "final_digest", "") or None,
            "schedule": cfg.schedule,
            "replay_size_at_start": self.start_replay_size,
            "stop_reason": coord.stop_reason or "loop ended",
            # What the job exits with (on every rank): 0 done, WORK_LEFT_EXIT stopped on
            # a signal with work left (checkpointed; resume to continue), 1 no checkpoint.
            "work_left": coord.work_left,
            "exit_status": (1 if checkpoint is None else
                            signals.WORK_LEFT_EXIT if coord.work_left else 0),
            "evaluations": coord.evals,
            # Each learner's wall ms per update by part (Learner.profile, the loop's
            # sleeps, and the rest of its loop): where a learner's time goes.
            "learner_profile": getattr(self, "learner_profiles", []),
        }
        if summary["learner_profile"]:
            # The updates those are per: this process's (a resume's restored ones are
            # not its work, nor in its profile's seconds).
            summary["learner_profile_updates"] = self.profile_updates
        if getattr(self, "rank_profiles", None):
            # --schedule sync: every rank's wall ms per round by phase (where a round's
            # time goes, waits included).
            summary["round_profile"] = self.rank_profiles
        if getattr(self.topo, "plan", None):    # --actors/--learners-per-node auto
            summary["plan"] = beside_run(self.topo.plan, summary)
        run_dir = Path(cfg.resolved_run_dir())
        _write_json(run_dir / "config.json", config_to_dict(cfg))
        _write_json(run_dir / "summary.json", summary)
        short = {k: v for k, v in summary.items()
                 if k not in ("evaluations", "plan", "learner_profile", "round_profile",
                              "learner_profile_updates")}
        print("summary: " + json.dumps(short), flush=True)
        return summary


def _write_json(path: Path, obj) -> None:
    """Write via a temporary file and a rename, so a reader never sees half a file.
    A failure (a full disk) is reported and leaves the old file, if any."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(json.dumps(obj, indent=1))
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        print(f"pal_hpc: error: could not write {path}: {exc}", file=sys.stderr, flush=True)


def beside_run(plan: dict, summary: dict) -> dict:
    """The plan with what the run measured beside it (whole-run averages: the warm-up
    before learning_starts and the evaluations are in them) and the relative error of
    the prediction, (predicted - measured) / measured."""
    wall = summary.get("wall_s") or 0.0
    out = {k: v for k, v in plan.items()}
    if wall > 0:
        measured = {"env_steps_per_s": summary["env_steps"] / wall,
                    "updates_per_s": summary["updates"] / wall}
        measured["gradient_batches_per_s"] = measured["updates_per_s"] * plan["learners"]
        out["measured"] = measured
        out["relative_error"] = {k: (plan[k] - v) / v if v > 0 else None
                                 for k, v in measured.items()}
    return out
