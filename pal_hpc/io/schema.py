"""The record types of the metrics log: one table (1-D compound dataset) per stream.

Every stream's table lives at `/<stream>` in `<run dir>/metrics.h5`.  Writers and
readers (the runtime, `pal_hpc.analyze`, any HDF5 tool) agree on these dtypes; the
`/learner` columns after the first three are the algorithm's `metric_names`.
"""

import numpy as np

EPISODES = np.dtype([
    ("env_step", np.int64),      # global env steps when the episode ended (approximate)
    ("wall_s", np.float64),      # seconds since the run started
    ("actor", np.int32),         # global actor index
    ("return", np.float64),
    ("length", np.int32),
])

def learner_dtype(metric_names) -> np.dtype:
    """The `/learner` table of an algorithm: the update, when, and its metric names."""
    return np.dtype([
        ("update", np.int64),        # learner steps so far (identical on every learner)
        ("wall_s", np.float64),
        ("env_step", np.int64),
        *[(name, np.float64) for name in metric_names],
    ])


# DQN's metrics: the default schema (and that of every log written before the
# algorithm contract, less its constant "lr" column).
LEARNER = learner_dtype(("loss", "td_abs_mean", "q_mean", "grad_norm"))

EVALUATION = np.dtype([
    ("env_step", np.int64),
    ("wall_s", np.float64),
    ("mean_return", np.float64),
    ("std_return", np.float64),
    ("episodes", np.int32),
])

SYSTEM = np.dtype([
    ("wall_s", np.float64),
    ("rank", np.int32),
    ("role", np.int8),           # 1 actor, 2 learner, 3 both
    ("env_steps_per_s", np.float64),
    ("updates_per_s", np.float64),
    ("replay_fill", np.float64),  # this rank's node replay: size / capacity
    ("sample_ms_p50", np.float64),
    ("sample_ms_p99", np.float64),
    ("insert_ms_p50", np.float64),
    ("insert_ms_p99", np.float64),
    ("rss_mb", np.float64),
])

STREAMS = {"episodes": EPISODES, "learner": LEARNER, "evaluation": EVALUATION, "system": SYSTEM}


def streams_for(metric_names=None) -> dict[str, np.dtype]:
    """The streams of a run whose algorithm reports `metric_names` (None: DQN's)."""
    if metric_names is None:
        return dict(STREAMS)
    return {**STREAMS, "learner": learner_dtype(metric_names)}
