"""The progress line's time left ("eta"), from the coordinator's own arithmetic."""

import numpy as np
import pytest

from pal_hpc.config import Config
from pal_hpc.runtime import stats as S
from pal_hpc.runtime.coordinator import Coordinator, format_seconds


def lines(cfg: Config, rate: float, seconds: int, capsys) -> list[str]:
    """The progress lines of a run making `rate` env steps a second, one line each 5 s."""
    coord = Coordinator(cfg, 0.0)
    total = np.zeros(S.SIZE)
    out = []
    for t in range(5, seconds + 1, 5):
        total[S.ENV_STEPS] = rate * t
        coord._print_progress(total, float(t), "replay  50%")
        out.append(capsys.readouterr().out.strip())
    return out


@pytest.mark.parametrize("seconds, text", [
    (0, "0s"), (44.6, "45s"), (59.4, "59s"), (60, "1m00s"), (725, "12m05s"),
    (3599, "59m59s"), (3600, "1h00m"), (11230, "3h07m"), (100 * 3600, "100h00m"),
])
def test_durations_read_as_a_person_writes_them(seconds, text):
    assert format_seconds(seconds) == text


def test_the_step_budget_at_the_recent_rate(capsys):
    # 1,000 steps/s toward 1M steps: after 60 s, 940,000 steps are left = 15m40s.
    out = lines(Config(total_steps=1_000_000, progress_every=5.0), 1000.0, 60, capsys)
    assert "eta" not in out[0]                  # no rate yet and no wall budget
    assert out[1].endswith("replay  50%  eta 16m30s"), out[1]
    assert out[-1].endswith("  eta 15m40s"), out[-1]


def test_the_nearer_budget_wins(capsys):
    # The wall budget (300 s) ends before the steps (1M at 1,000/s): 300 - 60 = 4m00s;
    # on the first line, before a rate is known, the wall budget alone.
    out = lines(Config(total_steps=1_000_000, wall_time=300.0), 1000.0, 60, capsys)
    assert out[0].endswith("  eta 4m55s"), out[0]
    assert out[-1].endswith("  eta 4m00s"), out[-1]


def test_the_rate_follows_the_recent_lines(capsys):
    # 100 steps/s for 10 min, then 1,000 steps/s: a minute later the estimate uses
    # the new rate alone (the last dozen lines), not the run's average.
    cfg = Config(total_steps=1_000_000)
    coord = Coordinator(cfg, 0.0)
    total = np.zeros(S.SIZE)
    for t in range(5, 601, 5):
        total[S.ENV_STEPS] = 100.0 * t
        coord._print_progress(total, float(t), "")
    for t in range(605, 661, 5):
        total[S.ENV_STEPS] += 5000.0
        coord._print_progress(total, float(t), "")
    out = capsys.readouterr().out.strip().splitlines()[-1]
    left = cfg.total_steps - total[S.ENV_STEPS]
    assert out.endswith("eta " + format_seconds(left / 1000.0)), out
