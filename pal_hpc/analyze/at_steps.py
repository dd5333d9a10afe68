"""`--at STEPS,...`: the runs' returns at chosen env steps, as one Markdown table per
(algorithm, environment) -- the table a results page puts under a learning curve.

Each run has two rows: its training return (the rolling mean of the last
`TRAIN_WINDOW` training episodes ended by those steps, exploration included) and its
greedy evaluation nearest to them (a run's evaluations fall a few steps off round
numbers; `references.run_at` picks them).  A cell a run did not reach is "-".
"""

from __future__ import annotations

import math

from pal_hpc.analyze.references import run_at
from pal_hpc.analyze.runs import TRAIN_WINDOW, Run


def parse_steps(text: str) -> list[int]:
    """'5e5,1_000_000,2e6' -> [500000, 1000000, 2000000] (sorted, duplicates dropped);
    ValueError naming the value that is not a whole number of env steps >= 1."""
    steps = set()
    for part in text.split(","):
        part = part.strip()
        try:
            value = float(part.replace("_", ""))
        except ValueError:
            raise ValueError(f"{part!r} is not a number of env steps "
                             f"(e.g. --at 5e5,1e6)") from None
        if not (math.isfinite(value) and value >= 1 and value == int(value)):
            raise ValueError(f"{part!r} is not a whole number of env steps >= 1")
        steps.add(int(value))
    return sorted(steps)


def _steps_label(steps: int) -> str:
    """500000 -> '0.5M', 1000000 -> '1M', 250000 -> '250k', 1234 -> '1,234'."""
    if steps >= 100_000 and steps % 100_000 == 0:
        return f"{steps / 1e6:g}M"
    if steps >= 1_000 and steps % 1_000 == 0:
        return f"{steps // 1_000}k"
    return f"{steps:,}"


def _cell(value: float | None, reached: bool) -> str:
    return f"{value:.1f}" if reached and value is not None else "-"


def steps_table(runs: list[Run], steps: list[int]) -> str:
    """The Markdown table of `runs` (one group) at `steps`."""
    head = "| run | env steps | " + " | ".join(_steps_label(s) for s in steps) + " |"
    rule = "|---|---|" + "---:|" * len(steps)
    lines = [head, rule]
    for run in runs:
        at = [run_at(run, s) for s in steps]
        lines.append(f"| {run.name} | training return (last {TRAIN_WINDOW} episodes) | "
                     + " | ".join(_cell(a["training"], a["reached"]) for a in at) + " |")
        lines.append("| | greedy evaluation (nearest) | "
                     + " | ".join(_cell(a["evaluation"], a["reached"]) for a in at) + " |")
    return "\n".join(lines)
