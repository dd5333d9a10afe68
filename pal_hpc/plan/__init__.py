"""How many actors and how many learners: measure this machine, predict every split.

    python -m pal_hpc.plan [the flags of pal_hpc.main] --ranks N [--cores C] [--json]

measures, on this machine and for this configuration, what one actor and one learner
cost, and predicts for every split of each node's ranks into learners and actors the
env steps/s and updates/s of the job, and which side limits it.  It prints the table
and marks the recommended split.  `--actors-per-node auto --learners-per-node auto` on
`pal_hpc.main` does the same at start-up (a few seconds of measurement on rank 0,
broadcast before the roles are assigned), and `summary.json` records the plan beside
what the run then measured (`pal_hpc.runtime.summary.beside_run`).  The on-policy
algorithm (paac) has no such split: it is refused.

The modules, each importing only those above it in this list:
- `model`: the pure model (Rates, Layout, predict, recommend, make_plan); its docstring
  holds the equations.
- `measure`: what one actor and one learner cost here (measure_rates); its docstring
  says what each input is and how it is measured.
- `probe`: the measurements among ranks: the Allreduce among L learners
  (measure_sync) and L learners updating at once (measure_gang).
- `startup`: the collective plan at start-up (plan_at_startup), called by pal_hpc.main
  before the roles are assigned.
- `cli` (and `__main__`): `python -m pal_hpc.plan`.

Direction of imports: the planner sits above the runtime.  It uses the runtime's
pieces (the real Actor, the learner's metric cadence, StatsRounds, the loop's sleeps in
`runtime.pacing`) to measure them; nothing in `pal_hpc.runtime` imports the planner,
which gets its result to the run as plain data (`Topology.plan`).
"""

from pal_hpc.plan.model import (TIE, Layout, Prediction, Rates, all_splits,
                                candidate_learners, default_split, fair_share, make_plan,
                                gang_time, others_from_share, predict, recommend,
                                sync_time)
from pal_hpc.plan.startup import layout_from_table, plan_at_startup, split_from_checkpoint

__all__ = ["TIE", "Layout", "Prediction", "Rates", "all_splits", "candidate_learners",
           "default_split", "fair_share", "gang_time", "layout_from_table", "make_plan",
           "others_from_share", "plan_at_startup", "predict", "recommend",
           "split_from_checkpoint", "sync_time"]
