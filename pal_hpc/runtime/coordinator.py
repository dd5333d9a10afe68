"""Rank 0's view of the job: progress lines, evaluations, the stop decision and when
to ask for a checkpoint.  It reads the job-wide counter sums (`runtime.stats`)."""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from pal_hpc.runtime import signals
from pal_hpc.runtime import stats as S


def wall_budget_used(cfg, restored_wall_s: float) -> str:
    """A warning for a resume whose --wall-time (which counts the run's wall time across
    resumes, as --total-steps counts its steps) is already used up; "" otherwise."""
    if cfg.wall_time > 0 and restored_wall_s >= cfg.wall_time:
        return (f"pal_hpc: warning: --wall-time {cfg.wall_time:g} counts the run's wall time "
                f"across resumes, and {restored_wall_s:,.1f} s of it are used: this run stops "
                f"at its first check; give a larger --wall-time to go on")
    return ""


class Coordinator:
    """Rank 0's view of the job: progress lines, evaluations, the stop decision."""

    def __init__(self, cfg, start: float, evals: list | None = None, telemetry=None):
        self.cfg = cfg
        self.telemetry = telemetry
        self.start = start
        self.evals: list[dict] = list(evals or [])
        self.recent = deque(maxlen=100)         # (sum, count) of episode returns per round
        self.last_print = start
        self.last_steps = 0.0
        self.last_updates = 0.0
        self.target_hit: dict | None = None
        self.stop_reason = ""
        self.work_left = False              # stopped on a signal before the budget was done
        self.last_checkpoint = start
        self.rate_window = deque(maxlen=13)   # (time, env steps) of the last progress lines

    def checkpoint_due(self) -> bool:
        """True when --checkpoint-every seconds have passed since the last checkpoint."""
        every = self.cfg.checkpoint_every
        if every > 0 and time.monotonic() - self.last_checkpoint >= every:
            self.last_checkpoint = time.monotonic()
            return True
        return False

    def observe(self, total: np.ndarray) -> bool:
        """Digest a completed round; True when the job should stop."""
        now = time.monotonic()
        if total[S.RETURN_COUNT] > 0:
            self.recent.append((total[S.RETURN_SUM], total[S.RETURN_COUNT]))
        if total[S.EVAL_COUNT] > 0:
            mean = total[S.EVAL_SUM] / total[S.EVAL_COUNT]
            rec = {"env_steps": int(total[S.EVAL_STEP]), "wall_s": round(now - self.start, 3),
                   "mean_return": float(mean), "episodes": int(total[S.EVAL_COUNT]),
                   "eval_s": round(float(total[S.EVAL_SECONDS]), 3)}
            self.evals.append(rec)
            if self.telemetry is not None:
                var = max(total[S.EVAL_SUMSQ] / total[S.EVAL_COUNT] - mean * mean, 0.0)
                self.telemetry.record("evaluation", (rec["env_steps"], rec["wall_s"], mean,
                                                     var ** 0.5, rec["episodes"]))
            print(f"[{now - self.start:8.1f}s] eval  steps {rec['env_steps']:>9,}  "
                  f"greedy return {mean:8.1f} over {rec['episodes']} episodes", flush=True)
            if (self.cfg.target_return is not None and self.target_hit is None
                    and mean >= self.cfg.target_return):
                self.target_hit = rec
        if now - self.last_print >= self.cfg.progress_every:
            self.progress(total, now)
        # A budget used up wins over a signal that came with it: the run is done.
        self.work_left = False
        if self.target_hit is not None:
            self.stop_reason = f"target return {self.cfg.target_return} reached"
        elif total[S.ENV_STEPS] >= self.cfg.total_steps:
            self.stop_reason = f"{self.cfg.total_steps} env steps done"
        elif self.cfg.wall_time > 0 and now - self.start >= self.cfg.wall_time:
            self.stop_reason = f"wall time {self.cfg.wall_time}s reached"
        elif total[S.PREEMPT] > 0:
            self.work_left = True
            self.stop_reason = (f"{signals.requested or 'SIGTERM/SIGUSR1/SIGINT'}: stopped "
                                f"early with work left; checkpointed, exit status "
                                f"{signals.WORK_LEFT_EXIT} (resume to continue)")
        return bool(self.stop_reason)

    def progress(self, total: np.ndarray, now: float) -> None:
        fill = total[S.REPLAY_SIZE] / max(total[S.REPLAY_CAPACITY], 1)
        self._print_progress(total, now, f"replay {fill:4.0%}")

    def _print_progress(self, total: np.ndarray, now: float, tail: str) -> None:
        """The progress line: time, env steps and updates with their rates since the
        last line, episodes and the recent mean return, then `tail`."""
        dt = max(now - self.last_print, 1e-9)
        steps, updates = total[S.ENV_STEPS], total[S.UPDATES]
        ret_sum = sum(s for s, _ in self.recent)
        ret_cnt = sum(c for _, c in self.recent)
        mean_ret = f"{ret_sum / ret_cnt:7.1f}" if ret_cnt else "      -"
        print(f"[{now - self.start:8.1f}s] steps {steps:>9,.0f} ({(steps - self.last_steps) / dt:7,.0f}/s)"
              f"  episodes {total[S.EPISODES]:>6,.0f}  return {mean_ret}"
              f"  updates {updates:>8,.0f} ({(updates - self.last_updates) / dt:6,.0f}/s)"
              f"  {tail}{self._eta(steps, now)}", flush=True)
        self.last_print, self.last_steps, self.last_updates = now, steps, updates

    def _eta(self, steps: float, now: float) -> str:
        """"  eta 1h05m": the time left to the nearer of the step and wall budgets, at the
        env-step rate over the last dozen progress lines (an upper bound when a target
        return may end the run first); empty while neither is known."""
        self.rate_window.append((now, steps))
        (t0, s0), left = self.rate_window[0], []
        if self.cfg.wall_time > 0:
            left.append(self.cfg.wall_time - (now - self.start))
        if now > t0 and steps > s0:
            left.append((self.cfg.total_steps - steps) * (now - t0) / (steps - s0))
        if not left:
            return ""
        return "  eta " + format_seconds(max(min(left), 0.0))


def format_seconds(seconds: float) -> str:
    """45s, 12m05s, 3h07m: a duration as a progress line shows it."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
