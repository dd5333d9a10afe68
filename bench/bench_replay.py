"""SharedReplay under mpiexec: writers inserting while one learner samples 256 and
updates priorities, for 1, 2 and 4 writer ranks (and the learner alone), beside
cpprb's MPPrioritizedReplayBuffer with the same process counts when the peer venv
has it (`make bench-peers`).  Prints inserts/s, learner cycles/s and ratios.

    python bench/bench_replay.py [--seconds 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = Path(sys.executable).with_name("mpiexec")
PEER_PYTHON = ROOT / ".venv-peers" / "bin" / "python"


def ours(writers: int, kind: str, capacity: int, seconds: float) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MPIR_CVAR_ENABLE_HEAVY_YIELD="1")
    cmd = [str(MPIEXEC), "-n", str(writers + 1), sys.executable, "-m", "mpi4py",
           str(ROOT / "bench" / "replay_worker.py"), "--writers", str(writers),
           "--kind", kind, "--capacity", str(capacity), "--seconds", str(seconds)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def peer(writers: int, kind: str, capacity: int, seconds: float) -> dict | None:
    script = ROOT / "bench" / "peer_replay.py"
    if not PEER_PYTHON.exists() or not script.exists():
        return None
    cmd = [str(PEER_PYTHON), str(script), "--writers", str(writers), "--kind", kind,
           "--capacity", str(capacity), "--seconds", str(seconds)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    if out.returncode != 0:
        print(f"  (cpprb run failed: {out.stderr.strip().splitlines()[-1:]})")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--quick", action="store_true", help="1 s runs, CartPole only")
    args = ap.parse_args()
    seconds = 1.0 if args.quick else args.seconds
    cases = [("cartpole", 1 << 20)] + ([] if args.quick else [("atari", 1 << 16)])
    print(f"SharedReplay benchmark: {os.cpu_count()} cores; each run {seconds:.0f} s; "
          f"learner batch 256; writers add 64 per call")
    for kind, cap in cases:
        alone = ours(0, kind, cap, seconds)
        peer_alone = peer(0, kind, cap, seconds)
        print(f"\n{kind}, capacity {cap}, {alone['bytes_per_transition']:.0f} bytes/transition")
        print(f"  learner alone: {alone['learner_cycles_per_s']:9.0f} cycles/s"
              + (f"   cpprb {peer_alone['learner_cycles_per_s']:9.0f}" if peer_alone else ""))
        print(f"  {'writers':>7} {'inserts/s':>12} {'cpprb':>12} {'ratio':>6} "
              f"{'learner/s':>10} {'vs alone':>8} {'cpprb':>9}")
        for w in (1, 2, 4):
            r = ours(w, kind, cap, seconds)
            p = peer(w, kind, cap, seconds)
            ratio = f"{r['inserts_per_s'] / p['inserts_per_s']:5.1f}x" if p else "    -"
            keep = r["learner_cycles_per_s"] / max(alone["learner_cycles_per_s"], 1e-9)
            peer_ins = f"{p['inserts_per_s']:12.0f}" if p else f"{'-':>12}"
            peer_cyc = f"{p['learner_cycles_per_s']:9.0f}" if p else f"{'-':>9}"
            print(f"  {w:>7} {r['inserts_per_s']:12.0f} {peer_ins} {ratio} "
                  f"{r['learner_cycles_per_s']:10.0f} {keep:7.0%} {peer_cyc}", flush=True)
    if not PEER_PYTHON.exists():
        print("\n(no .venv-peers: `make bench-peers` adds cpprb's MPPrioritizedReplayBuffer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
