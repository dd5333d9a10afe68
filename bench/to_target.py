"""What the time-to-target benchmarks share (bench_train.py: DQN; bench_continuous.py:
TD3/SAC): running the SB3 peer in .venv-peers, and reading and printing times to a
target where a run that did not get there counts as +infinity."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEER_PYTHON = ROOT / ".venv-peers" / "bin" / "python"


def tail(text: str, n: int = 1500) -> str:
    return text[-n:].strip()


def peer_available() -> str | None:
    """SB3's version in .venv-peers, or None when it cannot be used."""
    if not PEER_PYTHON.exists():
        return None
    out = subprocess.run([str(PEER_PYTHON), "-c",
                          "import stable_baselines3 as s; print(s.__version__)"],
                         capture_output=True, text=True, timeout=120)
    return out.stdout.strip() if out.returncode == 0 else None


def run_peer_script(script: str, args: list[str], timeout: float) -> dict:
    """Run bench/<script> in the peer venv (one torch/OpenMP thread); its last stdout
    line is the JSON result."""
    cmd = [str(PEER_PYTHON), str(ROOT / "bench" / script), *args]
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
