"""Offline analysis of runs: a table per run and PNG plots.

    python -m pal_hpc.analyze RUN [RUN ...] [--threshold R] [--out DIR]

(`pal_hpc.analyze.cli` documents the command and its flags.)  The modules, each
importing only those above it in this list:
- `runs`: reading a run (load_run: every log segment, summary.json, config.json), what
  its config and layout say, its evaluations and training returns in order.
- `references`: published results (PUBLISHED, the user's --reference) and a run's
  values beside them (table_rows).
- `table`: one run's numbers (run_stats) and the table that prints them (format_table).
- `curves`: a run's curves, config and summary in a small JSON file, and back
  (export_curves, load_curves).
- `plots`: the PNG plots of a group of runs (write_plots).
- `seeds`: a group's runs as seeds of one setting: their mean and spread (--seeds).
- `cli` (and `__main__`): `python -m pal_hpc.analyze`.
"""

from pal_hpc.analyze.cli import main
from pal_hpc.analyze.curves import CURVE_POINTS, CurvesReadError, export_curves, load_curves
from pal_hpc.analyze.plots import (THROUGHPUT_POINTS, plot_learning_curves, plot_scaling,
                                   plot_throughput, role_series, write_plots)
from pal_hpc.analyze.references import (PUBLISHED, Reference, parse_reference,
                                        references_for, run_at, table_rows)
from pal_hpc.analyze.runs import (ACTOR_BIT, LEARNER_BIT, TRAIN_WINDOW, Run, evaluations,
                                  group_key, group_runs, load_run, onpolicy_layout,
                                  rank_count, run_config, run_threshold, training_returns)
from pal_hpc.analyze.seeds import (CONFIG_BOOKKEEPING, SEED_GRID_POINTS, differing_settings,
                                   plot_seeds, seed_curves, seed_rows)
from pal_hpc.analyze.table import (final_replay_fill, format_table, planned_rates,
                                   role_throughput, run_stats)

__all__ = ["ACTOR_BIT", "CONFIG_BOOKKEEPING", "CURVE_POINTS", "CurvesReadError", "LEARNER_BIT",
           "PUBLISHED", "Reference", "Run", "SEED_GRID_POINTS", "THROUGHPUT_POINTS",
           "TRAIN_WINDOW", "differing_settings", "evaluations", "export_curves",
           "final_replay_fill", "format_table", "group_key", "group_runs",
           "load_curves", "load_run", "main", "onpolicy_layout", "parse_reference",
           "planned_rates", "plot_learning_curves", "plot_scaling", "plot_seeds",
           "plot_throughput", "rank_count", "references_for", "role_series",
           "role_throughput", "run_at", "run_config", "run_stats", "run_threshold",
           "seed_curves", "seed_rows", "table_rows", "training_returns", "write_plots"]
