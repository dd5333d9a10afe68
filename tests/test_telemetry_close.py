"""Rows rank 0 records after the collective `Telemetry.close()` -- what the wind-down's
last counter round observes (an evaluation that finished in it) -- still reach the log."""

import numpy as np
from mpi4py import MPI

from pal_hpc.io.metrics import open_run_log, read_run_metrics
from pal_hpc.io.schema import streams_for
from pal_hpc.runtime.telemetry import Telemetry


def test_rows_recorded_after_close_reach_the_log(tmp_path):
    streams = streams_for(("loss",))
    log = open_run_log(tmp_path, {"algo": "dqn"}, resume=False, streams=streams)
    tel = Telemetry(MPI.COMM_SELF.Dup(), log=log, streams=streams)
    tel.record("evaluation", (1000, 1.5, 12.0, 3.0, 5))
    tel.poll()
    tel.close()
    tel.record("evaluation", (2000, 3.0, 20.0, 1.0, 5))      # after close: the last round
    tel.close_log()
    tel.comm.Free()
    rows = read_run_metrics(tmp_path)["evaluation"]
    assert list(rows["env_step"]) == [1000, 2000]
    assert np.allclose(rows["mean_return"], [12.0, 20.0])
