"""The algorithm contract: what the runtime asks of an algorithm, and nothing more.

The runtime (processes, MPI, replay, checkpoints, metrics) knows no algorithm; an
algorithm knows no MPI.  Two sides, as in Acme's learner/actor split:

- `Algorithm` (learner side).  The runtime drives it through *update phases*: for
  update number u it asks `phases(u)` (say ("critic", "actor") on TD3's delayed
  steps), and for each phase in turn computes that phase's gradient into one flat
  float32 buffer (`compute_gradients`), sums it over every learner with one
  Allreduce, and hands the sum back (`apply_gradients`, with the scale that turns
  the learners' share-weighted sum into the mean over the update's global batch).
  The algorithm owns its optimizers, target networks and Polyak averaging; the
  runtime never sees them.  The first phase returns the new priorities of the
  sampled transitions (|TD error|), or None when the algorithm has none; its loss is
  the one the importance weights enter, linearly (the runtime divides its gradient
  by the batch's largest weight under `--per-weights batch`).
- `Policy` (actor side, `pal_hpc.algos.acting`): a copy of the network actors need
  (in numpy where the algorithm has it, `AlgoSpec.numpy_policy`), loaded from the flat
  vector the learners publish (`policy_params`), and `act`, which owns exploration
  (epsilon for DQN, Gaussian noise for DDPG/TD3, sampling for SAC).

A new algorithm is one module in `pal_hpc/algos/` (its `Config` dataclass, its
Policy and its Algorithm), one line in `pal_hpc/algos/__init__.py`'s registry and
one test file.  The config fields become flags, listed in `--help` under the
algorithm's name.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from pal_hpc.algos.nets import FlatParams
from pal_hpc.algos.acting import Policy
from pal_hpc.algos.spec import AlgoConfig


class NetworkPolicy(Policy):
    """A Policy over one CPU network whose parameters are views of one flat vector, so
    `set_flat_params` is a single copy of what the learners published."""

    def __init__(self, net: torch.nn.Module):
        self.net = net
        self._flat = FlatParams([net], torch.device("cpu")).flat

    @property
    def num_params(self) -> int:
        return self._flat.numel()

    @torch.no_grad()
    def set_flat_params(self, flat: np.ndarray) -> None:
        flat_t = torch.as_tensor(np.asarray(flat, dtype=np.float32))
        if flat_t.numel() != self.num_params:
            raise ValueError(f"vector has {flat_t.numel()} entries, expected {self.num_params}")
        self._flat.copy_(flat_t)        # a copy: never alias the caller's memory


class Algorithm(ABC):
    """The learner side of an algorithm (see the module docstring).

    Subclasses set `name`, `Config` and `metric_names`, and are built as
    `Algo(obs_space, act_space, config, device=..., seed=...)`; the same seed gives
    bit-identical parameters on every rank."""

    name: ClassVar[str]
    Config: ClassVar[type[AlgoConfig]]
    # Run-wide settings this algorithm wants when the user gives none (e.g. TD3's
    # gamma 0.98 and batches of 256); `pal_hpc.config_io.config_from_dict` applies them.
    run_defaults: ClassVar[dict] = {}

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, config: AlgoConfig, *,
                 device: Any = "cpu", seed: int = 0):
        self.obs_space, self.act_space, self.config = obs_space, act_space, config
        self.row_offset, self.row_total = 0, 0     # see set_rows; 0 rows = the whole batch

    # What the runtime asks before building anything -- `check_env(env_id, obs_space,
    # act_space)`, `signature_of(obs_space, act_space, config)`, `numpy_policy(...)`,
    # `metric_names` -- is the algorithm's spec's (`pal_hpc.algos.spec.AlgoSpec`), which
    # every algorithm class derives from.

    # -- acting ------------------------------------------------------------------------

    def make_policy(self, actor_index: int, n_actors: int) -> Policy:
        """A CPU policy for actor `actor_index` of `n_actors` (exploration may differ
        per actor, Ape-X style), holding the current policy parameters: by default the
        spec's numpy policy (`numpy_policy`, what an actor rank without torch builds);
        an algorithm with none for some spaces overrides this."""
        policy = self.numpy_policy(self.obs_space, self.act_space, self.config,
                                   actor_index, n_actors)
        if policy is None:
            raise NotImplementedError(f"{self.name}: no numpy policy for these spaces")
        policy.set_flat_params(self.policy_params())
        return policy

    @abstractmethod
    def policy_params(self) -> np.ndarray:
        """The flat float32 vector actors need (what the learners publish)."""

    # -- learning ----------------------------------------------------------------------

    @abstractmethod
    def phases(self, update: int) -> tuple[str, ...]:
        """The phases of update number `update` (0-based), in order.  Must depend on
        `update` alone: every learner runs the same phases."""

    @abstractmethod
    def phase_size(self, phase: str) -> int:
        """Length of `phase`'s flat gradient."""

    @abstractmethod
    def compute_gradients(self, phase: str, batch: dict[str, np.ndarray], out: np.ndarray,
                          metrics: bool = False) -> tuple[dict[str, float], np.ndarray | None]:
        """Write `phase`'s gradient on `batch` into `out` (float32, phase_size(phase));
        return (metrics -- {} unless `metrics` --, new priorities (B,) float64 or None).
        `batch` holds the transition fields plus "weights" (importance weights)."""

    @abstractmethod
    def apply_gradients(self, phase: str, flat_grad: np.ndarray, scale: float = 1.0) -> None:
        """Step `phase`'s optimizer with `flat_grad * scale` (target updates included)."""

    def set_rows(self, offset: int, total: int) -> None:
        """This learner's share of every update's global batch: its rows begin at row
        `offset` of `total` (the runtime's `--learner-batch split`).  Noise drawn per
        row (TD3's target smoothing, SAC's reparameterisation) is drawn for all `total`
        rows and sliced (`row_noise`), so L learners see the noise one learner on the
        union would, and every learner's generator stays in the same state."""
        self.row_offset, self.row_total = int(offset), int(total)

    def row_noise(self, b: int, cols: int, generator: torch.Generator,
                  device: torch.device) -> torch.Tensor:
        """(b, cols) standard normal draws for this learner's b rows (see set_rows)."""
        total = self.row_total if self.row_offset + b <= self.row_total else b
        noise = torch.randn((total, cols), generator=generator, device=device)
        return noise if total == b else noise[self.row_offset:self.row_offset + b]

    # -- state -------------------------------------------------------------------------

    @abstractmethod
    def state_arrays(self) -> list[np.ndarray]:
        """Every array the learners must agree on (networks, targets, temperatures):
        what `digest` hashes."""

    def digest(self) -> str:
        """SHA-256 over `state_arrays()`: equal on every learner after every update."""
        h = hashlib.sha256()
        for arr in self.state_arrays():
            h.update(np.ascontiguousarray(arr).tobytes())
        return h.hexdigest()

    @abstractmethod
    def state_dict(self) -> dict:
        """Everything a checkpoint needs: nested dicts of tensors, arrays and numbers."""

    @abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned."""

    def signature(self) -> dict:
        """What a checkpoint must match to be resumed into this algorithm (its spec's
        `signature_of`: its name, the spaces and every config field that changes a
        shape)."""
        return self.signature_of(self.obs_space, self.act_space, self.config)


class OnePhaseAlgorithm(Algorithm):
    """An Algorithm whose parameters are one flat buffer `self._flat` (a `FlatParams`
    view of every parameter) stepped in one update phase named `phase` (DQN's "q",
    PAAC's "ac"): the phase bookkeeping and the flat-vector accessors, once."""

    phase: ClassVar[str]

    def phases(self, update: int) -> tuple[str, ...]:
        return (self.phase,)

    def phase_size(self, phase: str) -> int:
        self._check_phase(phase)
        return self.num_params

    def _check_phase(self, phase: str) -> None:
        if phase != self.phase:
            raise ValueError(f"{self.name} has one update phase, {self.phase!r}; got {phase!r}")

    @property
    def num_params(self) -> int:
        """Number of scalars in the flat parameter vector."""
        return self._flat.numel()

    def get_flat_params(self) -> np.ndarray:
        """The parameters as one float32 vector (a copy), in parameter order."""
        return self._flat.detach().cpu().numpy().astype(np.float32, copy=True)

    @torch.no_grad()
    def set_flat_params(self, flat: np.ndarray) -> None:
        """Load the parameters from a vector laid out as get_flat_params' (a copy into
        our buffer: never an alias of the caller's numpy memory)."""
        flat_t = torch.as_tensor(np.asarray(flat, dtype=np.float32), device=self._flat.device)
        if flat_t.numel() != self.num_params:
            raise ValueError(f"vector has {flat_t.numel()} entries, expected {self.num_params}")
        self._flat.copy_(flat_t)
