"""The training entry of one rank: which loop the job runs (PAAC's on-policy loop, the
off-policy loop of `runtime.run`, or its `--schedule sync` rounds)."""

from __future__ import annotations

from pal_hpc.algos.registry import SPECS
from pal_hpc.runtime.imports import imports_done


def train(cfg, topo) -> int:
    """Run the job on this rank; returns the job's exit status, the same on every rank:
    0 (done) or `signals.WORK_LEFT_EXIT` (stopped on a signal with work left)."""
    if SPECS[cfg.algo].on_policy:        # PAAC, PPO: lockstep envs, no replay
        from pal_hpc.runtime.onpolicy import train_on_policy
        imports_done()
        return train_on_policy(cfg, topo)
    if cfg.schedule == "sync":         # fixed rounds: pal_hpc.runtime.sync_schedule
        from pal_hpc.runtime.sync_schedule import SyncRankRun as Job
    else:
        from pal_hpc.runtime.run import RankRun as Job
    imports_done()
    job = Job(cfg, topo)
    job.run()
    return job.exit_status
