"""What the time-to-target benchmarks share (bench_train.py: DQN; bench_continuous.py:
TD3/SAC; bench_paac.py: PAAC): running the SB3 peer (in .venv-peers, else .venv), the
seed loop, and reading and printing times to a target where a run that did not get
there counts as +infinity."""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEER_PYTHON = ROOT / ".venv-peers" / "bin" / "python"


def tail(text: str, n: int = 1500) -> str:
    return text[-n:].strip()


@functools.cache
def sb3_python() -> Path | None:
    """The python Stable-Baselines3 peers run in: .venv-peers' (`make bench-peers`) when
    it has stable_baselines3, else .venv's (`make install` puts SB3 there for
    pal_hpc.integrations' tests), else None."""
    for py in (PEER_PYTHON, ROOT / ".venv" / "bin" / "python"):
        if py.exists() and subprocess.run([str(py), "-c", "import stable_baselines3"],
                                          capture_output=True, timeout=120).returncode == 0:
            return py
    return None


def peer_available() -> str | None:
    """SB3's version in `sb3_python()`, or None when there is none to use."""
    py = sb3_python()
    if py is None:
        return None
    out = subprocess.run([str(py), "-c", "import stable_baselines3 as s; print(s.__version__)"],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        return None
    return f"{out.stdout.strip()} ({py.parent.parent.name})"


def peer_banner(sb3: str | None, no_peer: bool, what: str) -> None:
    """The line naming the peer (`what`: e.g. "A2C, ... hyperparameters (bench/x.py)"),
    or why there is none."""
    if sb3:
        print(f"peer: Stable-Baselines3 {sb3} {what}", flush=True)
    elif not no_peer:
        print("peer: none -- neither .venv-peers nor .venv has stable_baselines3; "
              "install it with `make bench-peers`", flush=True)


def run_seeds(configs: list[str], seeds: list[int], run_one: Callable[[str, int], dict],
              time_key: str, errors: list[str], label: str = "", width: int = 14
              ) -> dict[str, dict[int, dict | None]]:
    """Every (seed, config) run, seeds outermost so that slow drifts of the machine's
    load spread over all configurations alike; `run_one(cfg, seed)` returns the run's
    record.  A failed run is recorded as None, its message printed to stderr and added
    to `errors`; each run's outcome is printed as it ends."""
    note = " excl. eval" if "excl_eval" in time_key else ""
    records: dict[str, dict[int, dict | None]] = {c: {} for c in configs}
    for seed in seeds:
        for cfg in configs:
            try:
                rec = run_one(cfg, seed)
            except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
                msg = f"{label}{cfg} seed {seed} failed: {exc}"
                print(f"  ({msg})", file=sys.stderr, flush=True)
                errors.append(msg)
                rec = None
            records[cfg][seed] = rec
            t, s = reached(rec, time_key), reached(rec, "steps_to_target")
            status = "failed" if rec is None else (
                f"reached at {s:,.0f} steps, {t:.1f} s{note}" if not math.isinf(t)
                else f"not reached (best {rec.get('best_eval_return') or 0:.1f})")
            wall = f", run {rec['wall_s']:.1f} s" if rec else ""
            print(f"  {label}{cfg:<{width}} seed {seed}: {status}{wall}", flush=True)
    return records


def run_peer_script(script: str, args: list[str], timeout: float,
                    python: Path | None = None) -> dict:
    """Run bench/<script> in `python` (default: SB3's, `sb3_python()`) with one
    torch/OpenMP thread; its last stdout line is the JSON result."""
    py = python or sb3_python() or PEER_PYTHON
    cmd = [str(py), str(ROOT / "bench" / script), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=ROOT)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"exit {out.returncode}: {tail(out.stderr)}")
    return json.loads(lines[-1])


def reached(rec: dict | None, key: str) -> float:
    """The run's time or steps to the target, +inf when it did not get there."""
    if not rec or rec.get("steps_to_target") is None or rec.get(key) is None:
        return math.inf
    return float(rec[key])


def fmt(v: float, spec: str) -> str:
    return "-" if math.isinf(v) else format(v, spec)


def ratio(peer: float, ours: float) -> str:
    if math.isinf(peer) and math.isinf(ours):
        return "-"
    if math.isinf(peer):
        return "ours only"    # only pal_hpc's median reached the target
    if math.isinf(ours):
        return "SB3 only"
    return f"{peer / ours:.2f}x"
