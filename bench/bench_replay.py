"""SharedReplay under mpiexec: writer ranks inserting while one learner rank samples
256 and updates priorities, for 1, 2 and 4 writers (and the learner alone), beside
cpprb's MPPrioritizedReplayBuffer with the same process counts in the same run when
the peer venv has it (`make bench-peers`).

Two rows per writer count:
  flat out  writers insert as fast as they can: the insert-rate ratio to cpprb
  paced     writers hold 10x cpprb's measured rate (or 1M/s without cpprb): what the
            learner keeps of its solo rate while we insert 10x faster than cpprb

    python bench/bench_replay.py [--seconds 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from pal_hpc.cluster.launch import mpi_env, mpiexec

ROOT = Path(__file__).resolve().parent.parent
PEER_PYTHON = ROOT / ".venv-peers" / "bin" / "python"


def ours(writers: int, kind: str, capacity: int, seconds: float, rate: float = 0.0,
         prefill: float = 1.0) -> dict:
    env = mpi_env()
    cmd = mpiexec(writers + 1, ROOT / "bench" / "replay_worker.py", "--writers", str(writers),
           "--kind", kind, "--capacity", str(capacity), "--seconds", str(seconds),
           "--writer-rate", str(rate), "--prefill", str(prefill))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def peer(writers: int, kind: str, capacity: int, seconds: float,
         prefill: float = 1.0) -> dict | None:
    script = ROOT / "bench" / "peer_replay.py"
    if not PEER_PYTHON.exists():
        return None
    cmd = [str(PEER_PYTHON), str(script), "--writers", str(writers), "--kind", kind,
           "--capacity", str(capacity), "--seconds", str(seconds), "--prefill", str(prefill)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    if out.returncode != 0:
        print(f"  (cpprb run failed: {out.stderr.strip().splitlines()[-1:]})")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--prefill", type=float, default=1.0,
                    help="fraction of the buffer filled before every pal_hpc run (default: "
                         "full, the steady state of training; solo and concurrent runs alike)")
    ap.add_argument("--quick", action="store_true", help="1 s runs, CartPole only")
    ap.add_argument("--json", type=Path, help="also write every measurement to this file")
    args = ap.parse_args()
    seconds = 1.0 if args.quick else args.seconds
    cases = [("cartpole", 1 << 20)] + ([] if args.quick else [("atari", 1 << 16)])
    print(f"SharedReplay benchmark: {os.cpu_count()} cores, {seconds:.0f} s per run, learner "
          f"batch 256, writers add 64 per call; buffer {args.prefill:.0%} full before each "
          f"run; ranks > cores oversubscribe")
    records = []
    for kind, cap in cases:
        alone = ours(0, kind, cap, seconds, prefill=args.prefill)
        peer_alone = peer(0, kind, cap, seconds, args.prefill)
        solo = alone["learner_cycles_per_s"]
        print(f"\n{kind}, capacity {cap}: {alone['bytes_per_transition']:.0f} bytes/transition "
              f"({alone['bytes_per_transition'] * cap / 2**30:.2f} GiB per node)")
        line = f"  learner alone: pal_hpc {solo:8.0f} cycles/s"
        if peer_alone:
            line += (f", cpprb {peer_alone['learner_cycles_per_s']:6.0f} "
                     f"({solo / peer_alone['learner_cycles_per_s']:.0f}x)")
        print(line)
        print(f"  {'writers':>7} {'mode':>8} {'inserts/s':>11} {'cpprb':>9} {'ratio':>7} "
              f"{'learner/s':>10} {'of solo':>7} {'cpprb':>6}")
        records.append(dict(kind=kind, writers=0, ours=alone, cpprb=peer_alone))
        for w in (1, 2, 4):
            p = peer(w, kind, cap, seconds, args.prefill)
            flat = ours(w, kind, cap, seconds, prefill=args.prefill)
            target = 10 * p["inserts_per_s"] if p else 1e6
            paced = ours(w, kind, cap, seconds, rate=target / w, prefill=args.prefill)
            records.append(dict(kind=kind, writers=w, ours=flat, paced=paced, cpprb=p))
            for mode, r in (("flat out", flat), ("paced", paced)):
                ratio = f"{r['inserts_per_s'] / p['inserts_per_s']:6.1f}x" if p else f"{'-':>7}"
                ins = f"{p['inserts_per_s']:9.0f}" if p else f"{'-':>9}"
                cyc = f"{p['learner_cycles_per_s']:6.0f}" if p else f"{'-':>6}"
                print(f"  {w:>7} {mode:>8} {r['inserts_per_s']:11.0f} {ins} {ratio} "
                      f"{r['learner_cycles_per_s']:10.0f} {r['learner_cycles_per_s'] / solo:7.0%} "
                      f"{cyc}", flush=True)
    if not PEER_PYTHON.exists():
        print("\n(no .venv-peers: `make bench-peers` adds cpprb's MPPrioritizedReplayBuffer)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
