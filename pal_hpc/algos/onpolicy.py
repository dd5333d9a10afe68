"""The on-policy contract: what the lockstep runtime (`pal_hpc.runtime.onpolicy`) asks of
an algorithm beyond `Algorithm`, with the defaults of a one-step update (PAAC's).

A round is `rollout_steps(config)` steps of every environment of every node (the
spec's: every rank asks, the environment workers without importing torch).  Each
master:

1. acts: `rollout_act(obs, rng)` -> (actions, extras); the extras (say log-probs and
   values) are stored per step in the rollout under `rollout_fields()`'s names, and
   the environments get `env_actions(actions)`;
2. after the round, `begin_update(batch)` does the local work on its node's rollout
   and returns what every master must see of it (or None: nothing), which the
   runtime gathers from every master, in master order, with one collective;
3. `update_plan(batch, gathered, master)` yields the update's steps.  For each step
   the runtime computes `compute_gradients(phase, step, out)` into the front of one
   float32 buffer and `step_sums()` (`update_sums` floats) behind it, sums that
   buffer over the masters with one Allreduce, and hands it back:
   `apply_gradients(phase, grad, scale=grad_scale(masters))`, then `after_step(sums)`.
   Whatever ends the plan early must be read from the summed values, so every master
   takes the same number of steps (and of collectives);
4. `round_metrics(metrics)`: the learner row of the round (every `metrics_every`-th).

The algorithm still knows no MPI: the runtime owns both collectives.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from pal_hpc.algos.base import OnePhaseAlgorithm


class OnPolicyAlgorithm(OnePhaseAlgorithm):
    """An algorithm the on-policy runtime drives (see the module docstring).  The
    defaults are a one-step update on the whole round, its gradient averaged over the
    masters: PAAC's."""

    on_policy = True
    metrics_every: ClassVar[int] = 10     # a learner row every k-th update
    update_sums: ClassVar[int] = 0        # floats each step adds to its Allreduce
    _bf16 = None                          # a nets.Bf16Acting where acting runs in bf16

    def params_written(self) -> None:
        """The parameters changed (an update's step, a load): the bf16 acting copy, if
        any, is cast again before the next act."""
        if self._bf16 is not None:
            self._bf16.written()

    def set_flat_params(self, flat: np.ndarray) -> None:
        super().set_flat_params(flat)
        self.params_written()

    def rollout_fields(self) -> dict[str, tuple[tuple, Any]]:
        """Per-step extras `rollout_act` returns: name -> (shape per env, dtype)."""
        return {}

    def action_spec(self) -> tuple[tuple, Any]:
        """(shape per env, dtype) of the actions the rollout stores."""
        if isinstance(self.act_space, gym.spaces.Discrete):
            return (), np.int64
        return tuple(self.act_space.shape), np.float32

    def rollout_act(self, obs: np.ndarray, rng: np.random.Generator
                    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions for the batch of observations, and the step's extras."""
        return self.act(obs, rng), {}

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        """What the environments get for `actions` (say clipped to the action bounds)."""
        return actions

    def begin_update(self, batch: dict[str, np.ndarray]) -> Any:
        """Local work on this master's round before its update; returns what every
        master must see of it (gathered in master order), or None."""
        return None

    def update_plan(self, batch: dict[str, np.ndarray], gathered: list | None,
                    master: int) -> Iterable[dict[str, np.ndarray]]:
        """The update's steps: the batches `compute_gradients` takes, in order."""
        return (batch,)

    def step_sums(self) -> np.ndarray:
        """The `update_sums` floats of the last computed step, summed over masters."""
        return np.zeros(0, np.float32)

    def grad_scale(self, masters: int) -> float:
        """The scale that turns the masters' summed gradient into the step's."""
        return 1.0 / masters

    def after_step(self, sums: np.ndarray) -> None:
        """The summed `step_sums` of the step just applied."""

    def round_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """The round's learner row from the last step's metrics."""
        return metrics
