"""Run configuration: one dataclass whose documented fields become the `--flags`.

Values come from three layers, later ones winning: the dataclass defaults (which train
DQN on CartPole-v1), an optional `--config FILE` (TOML or JSON), and the flags given on
the command line.  `pal_hpc.config_io.load_config` validates the result before any rank
starts work, and every error names the offending field.  This module holds the dataclass,
its checks and the typed-field machinery; `pal_hpc.config_io` reads and writes configs
and builds the command line.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# ConfigError and option live in pal_hpc.options (the algorithms import them from there,
# this module imports the algorithms); they stay importable from here too.
from pal_hpc.options import ConfigError, option

DEVICES = ("auto", "cpu", "cuda")
LEARNER_BATCHES = ("split", "full")
SCHEDULES = ("async", "sync")
PER_WEIGHTS = ("batch", "buffer")
MAX_FANOUT = 4096  # the native KSumTree's limit
MAX_SEED = 2**32 - 1
# Above this, actors could only insert about one transition per million samples: the
# rate limiter would all but stop them (infinity stops them for good).
MAX_REPLAY_RATIO = 1e6
MIN_PEER_TIMEOUT = 5.0   # below: a rank descheduled on a crowded host looks lost
# actors_per_node / learners_per_node: a count, a fraction, 0 (the fixed default split)
# or AUTO (the planner, pal_hpc.plan, picks the split at start-up).
AUTO = "auto"
ALL = "all"                 # --master-envs all: a node's master steps all its envs
PerNode = float | str

_f = option


@dataclass
class Config:
    """Everything a run needs; the defaults train DQN on CartPole-v1."""

    # What to run.
    algo: str = _f("dqn", "algorithm to train (each one's own flags are listed below)")
    env: str = _f("CartPole-v1", "gymnasium environment id; Atari ids (ALE/Pong-v5) are "
                                 "preprocessed: frameskip 4, 4 stacked 84x84 uint8 frames")
    atari_terminal_on_life_loss: bool = _f(False, "Atari ids: a lost life ends the actors' "
                                                  "episode (the reset after it starts a new "
                                                  "game); evaluations play whole games")
    total_steps: int = _f(100_000, "environment steps to run, summed over all actors")
    wall_time: float = _f(0.0, "stop after this many seconds, counted across resumes (0 = none)")
    seed: int = _f(0, f"base random seed in [0, {MAX_SEED}]; each rank derives its own "
                      "from it")
    run_dir: str = _f("", "output directory (empty = runs/<algo>-<env>-<UTC timestamp>); "
                          "one job at a time may use it")
    overwrite: bool = _f(False, "start afresh in a run_dir that holds an earlier run, "
                                "deleting its metrics log, checkpoints and summary")

    # Layout of ranks.
    actors_per_node: PerNode = _f(0.0, "actor ranks per node: 0 = the ranks left after the "
                                       "learners, an integer >= 1 = that many, 0 < x < 1 = "
                                       "that fraction of the node's ranks, auto = the "
                                       "planner's choice (python -m pal_hpc.plan)")
    learners_per_node: PerNode = _f(0.0, "learner ranks per node: 0 = 1 per 4 ranks (at least "
                                         "1), an integer >= 1 = that many, 0 < x < 1 = that "
                                         "fraction of the node's ranks, auto = the split that "
                                         "a few seconds of measurement at start-up predict "
                                         "fastest (off-policy algorithms; see "
                                         "python -m pal_hpc.plan)")
    ranks_per_node: int = _f(0, "0 = use the real nodes; k > 0 = split each real node into "
                                "virtual nodes of k ranks (each with its own replay buffer)")
    device: str = _f("auto", "learner device: auto = CUDA when available, else CPU",
                     choices=DEVICES)
    master_envs: PerNode = _f(AUTO, "on-policy (paac): environments of each node that its "
                                    "master steps itself while the worker ranks step the "
                                    "rest (the same results, less handoff); an integer "
                                    ">= 0; all = every env (the other ranks wait idle); "
                                    "auto = all when a step of the node's envs costs "
                                    "under 1 ms (timed at start-up), else none on a host "
                                    "with more ranks than cores, else an equal share for "
                                    "every rank of the node (a rule from measurements, "
                                    "see docs/paac.md); a node of one rank's master "
                                    "steps them all")

    # Evaluation.
    eval_every: int = _f(5_000, "global env steps between greedy evaluations (0 = only at the end)")
    eval_episodes: int = _f(10, "episodes per greedy evaluation")
    eval_max_steps: int = _f(27_000, "cut an evaluation episode after this many env steps, "
                                     "scored so far (0 = never; docs/minatar.md)")
    target_return: float | None = _f(None, "stop once the greedy evaluation mean return reaches this (none = never)")

    # Acting and replay.
    envs_per_actor: int = _f(4, "environments each actor rank steps as one batch")
    replay_capacity: int = _f(100_000, "replay buffer capacity in transitions, per node; 0 = "
                                       "auto: 1,000,000, or the most that fit in the node's "
                                       "free memory (DQN's default on Atari ids)")
    batch_size: int = _f(64, "transitions per update, the global batch: with learner_batch "
                             "split each of L learners samples and differentiates a share")
    learner_batch: str = _f("split", "split: the learners share batch_size between them (one "
                                     "update with L learners = one learner on the union); "
                                     "full: every learner samples a whole batch_size and the "
                                     "update averages the L batches (the behaviour before)",
                            choices=LEARNER_BATCHES)
    learning_starts: int = _f(1_000, "transitions a node's buffer holds before its "
                                     "learners start")
    replay_ratio: float = _f(32.0, "sampled transitions per inserted transition "
                                  f"(Reverb-style rate limit), in (0, {MAX_REPLAY_RATIO:g}]")

    frame_dedup: bool = _f(True, "stacked image observations (Atari) store each frame once "
                                 "in the replay; obs and next_obs are rebuilt when sampled")
    reward_clip: bool = _f(False, "off-policy: clip each step's reward to [-1, 1] for "
                                  "learning (logged returns stay unclipped); DQN turns it "
                                  "on for Atari ids")

    # Returns and updates (every algorithm).
    gamma: float = _f(0.99, "discount factor, in (0, 1]")
    n_step: int = _f(3, "steps of the n-step return")
    publish_every: int = _f(10, "learner steps between weight publications to actors")

    # Prioritized replay.
    per_alpha: float = _f(0.6, "priority exponent alpha, in [0, 1] (0 = uniform)")
    per_beta: float = _f(0.4, "initial importance-sampling exponent beta, in [0, 1]; "
                              "annealed to 1 over the run")
    per_eps: float = _f(1e-6, "added to |TD error| so no priority is zero")
    per_weights: str = _f("batch", "how importance weights are normalised: batch = by the "
                                   "largest weight in the update's whole batch, the union "
                                   "of all learners' shares (Dopamine's Rainbow: each "
                                   "update's largest weight is 1); buffer = by the largest "
                                   "weight any stored transition could have, from the "
                                   "buffer's minimum priority (OpenAI baselines, torchrl).  "
                                   "With buffer, one transition whose |TD| is near 0 among "
                                   "a million sets every weight: on DQN Pong the weights "
                                   "averaged 0.1 at beta 0.4 and 0.004 at beta 1, and the "
                                   "loss with them",
                          choices=PER_WEIGHTS)
    fanout: int = _f(16, "children per sum-tree node: a power of two in [2, 4096] "
                         "(16 float32 = one 64-byte cache line)")

    # Schedule (off-policy algorithms).
    schedule: str = _f("async", "async: actors and learners run free under the rate limit; "
                                "sync: fixed rounds (every actor takes round_steps env steps "
                                "with the round's weights, the node's replay takes them in "
                                "actor order, the learners take round_updates updates, the "
                                "weights are published): one seed and layout, one result, "
                                "bit for bit", choices=SCHEDULES)
    round_steps: int = _f(100, "schedule sync: env steps each actor rank takes per round, "
                               "summed over its envs (a multiple of envs_per_actor)")
    round_updates: int = _f(1, "schedule sync: learner updates per round (each of "
                               "batch_size rows)")

    # Runtime.
    torch_threads: int = _f(1, "threads per rank of torch's intra-op pool and numpy's OpenBLAS")
    progress_every: float = _f(5.0, "seconds between progress lines")
    peer_timeout: float = _f(120.0, "seconds a wait for other ranks may last; then a peer "
                                    "that does not answer a probe ends the job (exit 76); "
                                    f"0 = none, else >= {MIN_PEER_TIMEOUT:g} and above the "
                                    "longest evaluation and checkpoint (docs/faults.md)")
    tensorboard: bool = _f(False, "rank 0 also writes TensorBoard event files of the "
                                  "metrics log's streams (episodes, learner, evaluation, "
                                  "system) into <run_dir>/tensorboard; the HDF5 log stays "
                                  "the record (needs the tensorboard package)")

    # Checkpoints and resume.
    resume: str = _f("", "resume from 'latest' (the newest valid checkpoint in run_dir), "
                         "'auto' (latest if there is one, else start fresh: for requeued "
                         "jobs) or a checkpoint file's path; empty = start fresh")
    checkpoint_every: float = _f(1800.0, "seconds between checkpoints while training (a lost "
                                         "node costs at most that; 0 = at the end and on signals)")
    keep_checkpoints: int = _f(3, "newest checkpoints kept in <run_dir>/checkpoints")
    checkpoint_replay: bool = _f(True, "store each node's replay buffer (with its tree) in "
                                       "checkpoints, so a resumed run does not start empty")

    # The algorithm's own hyper-parameters (its `Config` dataclass): not a flag itself,
    # its fields are.  None = that algorithm's defaults.
    algo_config: Any = field(default=None, metadata={"help": "", "flag": False})

    def __post_init__(self) -> None:
        if self.algo_config is None and self.algo in algorithms():
            self.algo_config = algorithms()[self.algo].Config()

    def resolved_run_dir(self, now: datetime | None = None) -> str:
        """`run_dir`, or `runs/<algo>-<env>-<UTC timestamp>` when it is empty.

        The timestamp differs between calls: resolve once (on rank 0) and share it.
        """
        if self.run_dir:
            return self.run_dir
        stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%d-%H%M%S")
        env = self.env.replace("/", "-")
        return str(Path("runs") / f"{self.algo}-{env}-{stamp}")

    def validate(self) -> None:
        """Raise `ConfigError` (message starting with the field name) on a bad value."""
        for name, tp in _field_types().items():
            _check_type(name, tp, getattr(self, name))
        _check_choice("algo", self.algo, tuple(algorithms()))
        _check_choice("device", self.device, DEVICES)
        _check_choice("learner_batch", self.learner_batch, LEARNER_BATCHES)
        _check_choice("schedule", self.schedule, SCHEDULES)
        _check_choice("per_weights", self.per_weights, PER_WEIGHTS)
        _check_env(self.env)

        req = lambda name, ok, what: _require(self, name, ok, what)  # noqa: E731
        req("atari_terminal_on_life_loss", not self.atari_terminal_on_life_loss
            or _is_atari(self.env), f"applies to Atari (ALE/...) ids only, not {self.env!r}")
        # inf passes "> 0" and then breaks the run (an inf learning rate, a rate limiter
        # that never releases the actors): every float must be finite.
        for name, tp in _field_types().items():
            value = getattr(self, name)
            if _base_type(tp) is float and value is not None:
                req(name, math.isfinite(value), "must be finite")
        Algo = algorithms()[self.algo]
        if not isinstance(self.algo_config, Algo.Config):
            raise ConfigError(f"algo_config: --algo {self.algo} needs a "
                              f"{Algo.Config.__name__}, got {type(self.algo_config).__name__}")
        for name, tp in _algo_field_types(Algo.Config).items():
            _check_type(name, tp, getattr(self.algo_config, name))
        self.algo_config.validate()
        for name in ("total_steps", "eval_episodes", "envs_per_actor", "batch_size", "n_step", "publish_every", "torch_threads",
                     "keep_checkpoints", "round_steps", "round_updates"):
            req(name, getattr(self, name) >= 1, "must be >= 1")
        for name in ("seed", "ranks_per_node", "eval_every", "eval_max_steps", "learning_starts",
                     "replay_capacity"):
            req(name, getattr(self, name) >= 0, "must be >= 0")
        # Every check is phrased as "ok if ...", so NaN fails them all.
        for name in ("replay_ratio", "per_eps", "progress_every"):
            req(name, getattr(self, name) > 0, "must be > 0")
        for name in ("wall_time", "checkpoint_every"):
            req(name, getattr(self, name) >= 0, "must be >= 0")
        req("peer_timeout", self.peer_timeout == 0 or self.peer_timeout >= MIN_PEER_TIMEOUT,
            f"must be 0 (no deadline) or >= {MIN_PEER_TIMEOUT:g} seconds")
        for name in ("per_alpha", "per_beta"):
            req(name, 0 <= getattr(self, name) <= 1, "must be in [0, 1]")
        req("gamma", 0 < self.gamma <= 1, "must be in (0, 1]")
        req("seed", self.seed <= MAX_SEED, f"must be in [0, {MAX_SEED}]")
        req("replay_ratio", self.replay_ratio <= MAX_REPLAY_RATIO,
            f"must be <= {MAX_REPLAY_RATIO:g} (the actors would all but stop)")
        req("overwrite", not (self.overwrite and self.resume),
            f"cannot be combined with --resume {self.resume!r} (resume continues the run; "
            "overwrite deletes it)")
        # 0 = auto: the start-up sizes it (at least batch_size and learning_starts).
        req("replay_capacity", self.replay_capacity == 0 or self.replay_capacity >= self.batch_size,
            f"must be 0 (auto) or >= batch_size ({self.batch_size})")
        req("learning_starts", self.replay_capacity == 0
            or self.learning_starts <= self.replay_capacity,
            f"must be <= replay_capacity ({self.replay_capacity}) or learning never starts")
        req("fanout", 2 <= self.fanout <= MAX_FANOUT and self.fanout & (self.fanout - 1) == 0,
            f"must be a power of two in [2, {MAX_FANOUT}]")
        req("schedule", self.schedule == "async" or not getattr(Algo, "on_policy", False),
            f"sync applies to the off-policy algorithms; --algo {self.algo} already runs a "
            f"fixed per-step pattern")
        req("round_steps", self.schedule == "async"
            or self.round_steps % self.envs_per_actor == 0,
            f"must be a multiple of envs_per_actor ({self.envs_per_actor}): each of an "
            f"actor's envs takes round_steps / envs_per_actor steps per round")
        req("master_envs", self.master_envs in (AUTO, ALL) or (
            not isinstance(self.master_envs, (bool, str)) and self.master_envs >= 0
            and float(self.master_envs).is_integer()),
            "must be auto, all or an integer >= 0 (the environments a node's master steps)")
        check_per_node("actors_per_node", self.actors_per_node)
        check_per_node("learners_per_node", self.learners_per_node)
        for name in ("actors_per_node", "learners_per_node"):  # before ranks import torch
            req(name, getattr(self, name) == 0 or not getattr(Algo, "on_policy", False),
                f"--algo {self.algo} runs one master per node and makes the other ranks "
                f"environment workers (leave it 0; auto plans actors and learners for the "
                f"off-policy algorithms)")


def check_per_node(name: str, value: float | str) -> None:
    """A per-node rank count: "auto" (the planner's), 0 (the default split), a fraction
    in (0, 1), or an integer >= 1."""
    if value == AUTO:
        return
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value)
          and (value == 0 or 0 < value < 1 or (value >= 1 and float(value).is_integer())))
    if not ok:
        raise ConfigError(f"{name}: must be auto, 0 (the default split), a fraction in "
                          f"(0, 1) or an integer >= 1, got {value!r}")


def _require(cfg: Config, name: str, ok: bool, what: str) -> None:
    """Raise `ConfigError("<name>: <what>, got <value>")` unless `ok`."""
    if not ok:
        raise ConfigError(f"{name}: {what}, got {getattr(cfg, name)!r}")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name}: must be one of {', '.join(choices)}; got {value!r}")


def _check_env(env_id: str) -> None:
    """The id must be registered in gymnasium (Atari ids once ale_py is imported)."""
    import gymnasium

    try:
        import ale_py

        gymnasium.register_envs(ale_py)
    except ImportError:
        pass
    try:
        gymnasium.spec(env_id)
    except Exception as exc:  # gymnasium raises several error types for unknown ids
        raise ConfigError(f"env: {env_id!r} is not a registered gymnasium environment "
                          f"({exc})") from None


def _is_atari(env_id: str) -> bool:
    from pal_hpc.envs.make import is_atari   # imports gymnasium: only when validating

    return is_atari(env_id)


# ---------------------------------------------------------------------------------------
# Types: plain JSON/TOML values <-> field values, checked strictly (no silent coercion).

def algorithms() -> dict[str, Any]:
    """The algorithms' specs by name (`pal_hpc.algos.registry`: their config classes and
    defaults, without torch, which `--help` and config validation need not wait for;
    imported when first needed)."""
    from pal_hpc.algos.registry import SPECS

    return SPECS


@functools.cache
def _field_types() -> dict[str, Any]:
    """Run-wide flag name -> evaluated annotation (annotations are strings here)."""
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] for f in dataclasses.fields(Config)
            if f.metadata.get("flag", True)}


@functools.cache
def _algo_field_types(config_class: type) -> dict[str, Any]:
    """An algorithm config's field name -> evaluated annotation."""
    hints = typing.get_type_hints(config_class)
    return {f.name: hints[f.name] for f in dataclasses.fields(config_class)}


def algo_options() -> dict[str, list[str]]:
    """Each algorithm option's name -> the algorithms that take it (registry order)."""
    owners: dict[str, list[str]] = {}
    for name, Algo in algorithms().items():
        for f in dataclasses.fields(Algo.Config):
            owners.setdefault(f.name, []).append(name)
    return owners


def _is_optional(tp: Any) -> bool:
    return isinstance(tp, types.UnionType) and type(None) in typing.get_args(tp)


def _base_type(tp: Any) -> Any:
    """`float | None` -> float; `list[int]` -> list; others unchanged."""
    if _is_optional(tp):
        (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
    return typing.get_origin(tp) or tp


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_type(name: str, tp: Any, value: Any) -> Any:
    """Return `value` as the field's type (int -> float is the only conversion), or raise."""
    if value is None and _is_optional(tp):
        return None
    if tp == PerNode:                 # a number, or a word that validate() checks
        if isinstance(value, str):
            return value
        if _is_int(value) or isinstance(value, float):
            return float(value)
        raise ConfigError(f"{name}: expected a number or \"{AUTO}\", got {value!r} "
                          f"({type(value).__name__})")
    base = _base_type(tp)
    if base is bool and isinstance(value, bool):
        return value
    if base is int and _is_int(value):
        return value
    if base is float and (_is_int(value) or isinstance(value, float)):
        return float(value)
    if base is str and isinstance(value, str):
        return value
    if base is list and isinstance(value, list) and all(_is_int(v) for v in value):
        return list(value)
    want = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
            list: "a list of integers"}[base]
    if _is_optional(tp):
        want += " or none"
    raise ConfigError(f"{name}: expected {want}, got {value!r} ({type(value).__name__})")
