"""Shared by the resume-on-another-layout tests: train to a checkpoint through the real
entry point, resume it on another layout with tests/mpi/resume_layout_dump.py, and read
what the checkpoint's files hold (plain replays read straight from the HDF5 columns and
the tree's leaves, with no replay code in between)."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import h5py
import numpy as np

from conftest import FAST_FLAGS, ROOT, mpi_env, pal_cmd, run_mpi
from pal_hpc.io.checkpoint import list_checkpoints, node_of_replay
from pal_hpc.replay import KSumTree
from pal_hpc.replay._replaycore import max_priority_word, writes_word
from pal_hpc.runtime import stats as S

DUMP = ROOT / "tests" / "mpi" / "resume_layout_dump.py"
SAVED_AT = (6, 3)                                       # 2 virtual nodes x 3 ranks
LAYOUTS = {"1x2": (2, 2), "3x2": (6, 2), "2x3": (6, 3)}  # name: (ranks, ranks per node)


def run(nprocs: int, run_dir, *flags, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run(pal_cmd(nprocs, run_dir, *flags), cwd=ROOT, env=mpi_env(),
                          capture_output=True, text=True, timeout=timeout)


def train_to_checkpoint(run_dir: Path, flags: list[str], steps: int) -> Path:
    """A run at SAVED_AT to its final checkpoint; returns the checkpoint."""
    n, k = SAVED_AT
    proc = run(n, run_dir, *flags, "--ranks-per-node", str(k), "--total-steps", str(steps))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return list_checkpoints(run_dir)[-1]


def dump(out: Path, main: Path, layout: str, flags: list[str], timeout: float = 300) -> dict:
    """Resume `main` on `layout` (no training) and read back what every node holds."""
    n, k = LAYOUTS[layout]
    out.mkdir(parents=True)
    run_dir = out / "run"
    proc = run_mpi(n, DUMP, str(out), *FAST_FLAGS, "--run-dir", str(run_dir), *flags,
                   "--resume", str(main),
                   "--ranks-per-node", str(k), timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = json.loads((out / "job.json").read_text())
    job["stdout"] = proc.stdout
    job["node_files"] = []
    for node in range(job["nodes"]):
        with h5py.File(out / f"node{node}.h5", "r") as f:
            job["node_files"].append({"rows": f["rows"][()], "prio": f["prio"][()],
                                      "slots": f["slots"][()],
                                      **{k: f.attrs[k] for k in f.attrs}})
    return job


def held(job: dict) -> Counter:
    """(row bytes, stored priority) of every row the resumed nodes hold."""
    return Counter((bytes(row), float(p)) for node in job["node_files"]
                   for row, p in zip(node["rows"], node["prio"]))


def replay_parts(main: Path) -> list[Path]:
    with h5py.File(main, "r") as f:
        names = json.loads(f.attrs["replay_files"])
    return [main.with_name(n) for n in sorted(names, key=node_of_replay)]


def saved_plain_rows(main: Path) -> list[tuple]:
    """(row bytes, priority, age, node, region) of every row a plain checkpoint's replay
    files hold, read from the columns and the tree's leaves; age = rows its region
    received after it."""
    out = []
    for node, path in enumerate(replay_parts(main)):
        with h5py.File(path, "r") as f:
            sig = json.loads(f.attrs["signature"])
            g = f["replay"]
            cap, regions = sig["capacity"], sig["regions"]
            off = KSumTree.layout(cap, sig["fanout"])[0]["offset"]
            leaves = g["tree"][()][off:off + 4 * cap].view(np.float32)
            control = g["control"][()]
            cols = [g[f"column.{n}"][()] for n in sig["spec"]]
            k = 0
            for r in range(regions):
                a, b = r * cap // regions, (r + 1) * cap // regions
                length, w = b - a, int(control[writes_word(r)])
                for i in range(min(w, length)):
                    last = i + length * ((w - 1 - i) // length)
                    row = b"".join(np.ascontiguousarray(c[k + i]).tobytes() for c in cols)
                    out.append((row, float(leaves[a + i]), w - 1 - last, node, r))
                k += min(w, length)
    return out


def newest(rows: list[tuple], room: int) -> Counter:
    """The (row, priority) multiset of the `room` newest rows: (age, node, region) first."""
    return Counter((r, p) for r, p, *_ in sorted(rows, key=lambda x: x[2:])[:room])


def saved_max_priorities(main: Path) -> list[float]:
    """Each saved node's max priority (what its new rows got)."""
    out = []
    for path in replay_parts(main):
        with h5py.File(path, "r") as f:
            control = f["replay/control"][()]
            out.append(float(control[max_priority_word():][:1].view(np.float64)[0]))
    return out


def saved_counters(main: Path) -> dict:
    """The checkpoint's job-wide counters, its per-rank RNG states and its evaluator's
    next evaluation."""
    with h5py.File(main, "r") as f:
        ranks = [f[f"ranks/rank_{r}"] for r in range(len(f["ranks"]))]
        sums = np.sum([json.loads(g.attrs["stats"]) for g in ranks], axis=0)
        layout = json.loads(f.attrs["layout"])
        evaluator = next(r for r, (_, a, _) in enumerate(layout) if a)
        return {"env_steps": int(f.attrs["env_steps"]), "updates": int(f.attrs["updates"]),
                "sums": sums, "digest": f.attrs["params_digest"],
                "np_rng": [g.attrs["np_rng"] for g in ranks],
                "next_eval": float(ranks[evaluator].attrs["next_eval"])}


def check_counters(job: dict, saved: dict) -> None:
    """Env steps, updates and episodes kept exactly; the actors' steps add up."""
    totals = np.asarray(job["totals"])
    for slot in (S.ENV_STEPS, S.EPISODES, S.UPDATES):
        assert totals[slot] == saved["sums"][slot], (slot, totals[slot], saved["sums"][slot])
    assert sum(r["actor_steps"] or 0 for r in job["ranks"]) == saved["env_steps"]
    assert job["algo_state_equal"], "parameters, targets or optimizer state differ"
    assert job["digest"] == saved["digest"]
    evaluator = next(r for r in job["ranks"] if r["actor_steps"] is not None)
    assert evaluator["next_eval"] == saved["next_eval"]


def run_files(run_dir: Path) -> dict:
    """Every file of a run directory (but its lock) -> (size, mtime): what a refused
    resume must leave as it was."""
    return {str(p.relative_to(run_dir)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in Path(run_dir).rglob("*") if p.is_file() and p.name != ".lock"}
