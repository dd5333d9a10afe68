"""Published results to put beside a run: the values the papers and libraries we
reproduce report, for the (algorithm, environment) they ran, and the ones a user names
with `--reference LABEL=VALUE[@STEPS]`.

A reference is a return at a number of env steps (or a level, without steps) and says
which of a run's curves it is comparable with: `training` (the returns of the episodes
the agent played while learning, exploration included -- what the MinAtar paper and
CleanRL's tables report) or `evaluation` (greedy evaluations).  Values read off a
paper's curve rather than from its text or tables are marked `approx` and shown as
"about".  Only facts (numbers and their sources) are here; the runs they came from
are the papers' own.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from pal_hpc.analyze.runs import Run, evaluations, training_returns

MEASURES = ("training", "evaluation")


@dataclass(frozen=True)
class Reference:
    label: str                    # who reported it, short: the plot's legend
    value: float                  # mean return
    steps: int | None = None      # env steps it is reported at; None: a level only
    spread: float | None = None   # +- (std over the seeds) where the source gives one
    measure: str = "training"     # which curve of a run it compares with (MEASURES)
    approx: bool = False          # read off a curve: "about"
    source: str = ""              # where it comes from, for the docs and the curious

    def describe(self) -> str:
        """'about 10 (training) at 5,000,000 env steps' and the like."""
        value = f"{'about ' if self.approx else ''}{self.value:g}"
        if self.spread is not None:
            value += f" +- {self.spread:g}"
        at = f" at {self.steps:,} env steps" if self.steps is not None else ""
        return f"{value} ({self.measure}){at}"


_MINATAR = ("Young & Tian 2019 (MinAtar): DQN's training returns at 5M frames, all six "
            "actions, sticky actions 0.1, averaged over 30 seeds; read off the paper's curves")
_CLEANRL = "CleanRL's benchmark tables (Huang et al. 2022), mean +- std over 3 seeds"


def _minatar_dqn(value: float, version: str) -> tuple[Reference, ...]:
    # The paper's runs had all six actions, as the -v0 ids; -v1 has the minimal set.
    label = "MinAtar paper's DQN" + (" (on -v0: all 6 actions)" if version == "v1" else "")
    return (Reference(label, value, 5_000_000, measure="training", approx=True,
                      source=_MINATAR),)


PUBLISHED: dict[tuple[str, str], tuple[Reference, ...]] = {
    **{("dqn", f"MinAtar/{game}-{v}"): _minatar_dqn(value, v)
       for game, value in (("Asterix", 17.0), ("Breakout", 10.0), ("Freeway", 50.0),
                           ("SpaceInvaders", 43.0))
       for v in ("v0", "v1")},
    ("ppo", "CartPole-v1"): (Reference("CleanRL ppo.py", 490.04, 500_000, 6.12,
                                       source=_CLEANRL),),
    ("ppo", "Hopper-v4"): (Reference("CleanRL ppo_continuous_action.py", 2051.80,
                                     1_000_000, 313.94, source=_CLEANRL),),
    ("ppo", "HalfCheetah-v4"): (Reference("CleanRL ppo_continuous_action.py", 2905.85,
                                          1_000_000, 1129.37, source=_CLEANRL),),
    ("ppo", "ALE/Pong-v5"): (Reference("CleanRL ppo_atari.py (PongNoFrameskip-v4)", 20.36,
                                       10_000_000, 0.20, source=_CLEANRL),),
}

_USER = re.compile(r"^(?P<label>[^=]+)=(?P<value>[^@]+)(?:@(?P<steps>.+))?$")


def parse_reference(text: str) -> Reference:
    """A user's `LABEL=VALUE[@STEPS]` (STEPS may use underscores or an exponent: 5e6);
    ValueError naming what is wrong."""
    m = _USER.match(text.strip())
    if not m or not m["label"].strip():
        raise ValueError(f"expected LABEL=VALUE[@STEPS] (e.g. \"paper=10@5e6\"), got {text!r}")
    try:
        value = float(m["value"])
    except ValueError:
        raise ValueError(f"VALUE of {text!r} is not a number: {m['value']!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"VALUE of {text!r} must be finite, got {m['value']!r}")
    steps = None
    if m["steps"] is not None:
        try:
            as_float = float(m["steps"].replace("_", ""))
        except ValueError:
            raise ValueError(f"STEPS of {text!r} is not a number: {m['steps']!r}") from None
        if not (math.isfinite(as_float) and as_float >= 0 and as_float == int(as_float)):
            raise ValueError(f"STEPS of {text!r} must be a whole number >= 0, "
                             f"got {m['steps']!r}")
        steps = int(as_float)
    return Reference(m["label"].strip(), value, steps, source="--reference")


def references_for(algo: str, env: str, user: list[Reference],
                   published: bool = True) -> list[Reference]:
    """The published references of (algo, env) (unless not `published`), then the user's."""
    return [*(PUBLISHED.get((algo, env), ()) if published else ()), *user]


def run_at(run: Run, steps: int) -> dict:
    """A run's values at `steps` env steps, for the table: the training return's
    rolling mean of the last episode ended by then, the greedy evaluation nearest to
    `steps` (a run's evaluations fall a few steps off the round numbers), and how far the run went (`reached`: it logged an episode or evaluation at or past
    `steps`)."""
    train = training_returns(run, by="env_step")
    ev = evaluations(run)
    ends = [int(train["env_step"][-1])] if train is not None else []
    ends += [int(ev["env_step"].max())] if ev.size else []
    last = max(ends, default=0)
    out: dict = {"reached": last >= steps, "last_step": last,
                 "training": None, "evaluation": None, "evaluation_step": None}
    if train is not None:
        i = np.searchsorted(train["env_step"], steps, side="right") - 1
        if i >= 0:
            out["training"] = float(train["mean_return"][i])
    if ev.size:
        row = ev[np.argmin(np.abs(ev["env_step"].astype(np.int64) - steps))]
        out["evaluation"], out["evaluation_step"] = float(row["mean_return"]), \
            int(row["env_step"])
    return out


def table_rows(run: Run, refs: list[Reference]) -> list[tuple[str, str]]:
    """One row per reference: its value and this run's at the same env steps."""
    rows = []
    for ref in refs:
        text = ref.describe()
        if ref.steps is not None:
            here = run_at(run, ref.steps)
            if not here["reached"]:
                text += f"; this run stopped at {here['last_step']:,}"
            else:
                parts = []
                if here["training"] is not None:
                    parts.append(f"training {here['training']:.1f}")
                if here["evaluation"] is not None:
                    parts.append(f"greedy {here['evaluation']:.1f} "
                                 f"(at {here['evaluation_step']:,})")
                text += "; this run there: " + (", ".join(parts) or "no returns logged")
        rows.append((f"reference: {ref.label}", text))
    return rows
