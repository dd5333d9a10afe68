"""The gymnasium vector API of `LockstepVectorEnv` over the lockstep protocol: which call
is pending (as AsyncVectorEnv: one at a time, with its error types and messages), how a
round's results become a batch, and how the env shuts down.

A wait that times out raises `multiprocessing.TimeoutError` as AsyncVectorEnv does; the
round goes on in the workers and the next command first waits for it (its results are
dropped, its errors raised).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from copy import deepcopy
from typing import Any

import numpy as np
from gymnasium import logger
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.vector.utils import concatenate, create_empty_array, iterate

from pal_hpc.envs.lockstep_errors import raise_failures
from pal_hpc.envs.lockstep_protocol import (
    OP_CALL, OP_CLOSE, OP_NAMES, OP_RESET, OP_SETATTR, OP_STEP, S_OUT_LEN, LockstepError,
    error_record, read_out,
)
from pal_hpc.envs.lockstep_spaces import action_checks

_NOT_BY_CALL = ("reset", "step", "close", "_setattr", "_check_spaces")


class LockstepAPI:
    """reset/step/call/get_attr/set_attr/render/close for `LockstepVectorEnv`."""

    # ------------------------------------------------------------------ reset

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None):
        """Reset every sub-environment (or those in `options["reset_mask"]`)."""
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def reset_async(self, seed: int | list[int | None] | None = None,
                    options: dict[str, Any] | None = None) -> None:
        """Start resetting the sub-environments; `reset_wait` collects."""
        self._check_open()
        n = self.num_envs
        if seed is None:
            seeds = [None] * n
        elif isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            seeds = [int(seed) + i for i in range(n)]
        else:
            seeds = [None if s is None else int(s) for s in seed]
        if len(seeds) != n:
            raise ValueError(f"If seeds are passed as a list the length must match "
                             f"num_envs={n} but got length={len(seeds)}.")
        self._check_idle("reset_async", colon=False)
        options = dict(options) if options is not None else None
        mask = options.pop("reset_mask") if options and "reset_mask" in options else None
        if mask is not None:
            key = "`options['reset_mask']`"
            if not isinstance(mask, np.ndarray):
                raise TypeError(f"{key} must be a numpy array, got {type(mask)}")
            if mask.shape != (n,):
                raise ValueError(f"{key} must have shape `({n},)`, got {mask.shape}")
            if mask.dtype != np.bool_:
                raise TypeError(f"{key} must have `dtype=np.bool_`, got {mask.dtype}")
            if not mask.any():
                raise ValueError(f"{key} must contain a boolean array with at least one "
                                 f"True value, got reset_mask={mask}")
        self._start(OP_RESET, "reset", {"seeds": seeds, "options": options, "mask": mask})

    def reset_wait(self, timeout: float | None = None):
        """The observations and infos of the reset started by `reset_async`."""
        outs = self._finish("reset", timeout)
        return self._observations(outs), self._infos(outs)

    # ------------------------------------------------------------------ step

    def step(self, actions):
        """Step every sub-environment once, autoresetting as `autoreset_mode` says."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions) -> None:
        """Hand the actions to the workers and return at once; `step_wait` collects."""
        self._check_open()
        self._check_idle("step_async")
        if self._act_plan.fixed:
            leaves = self._checked(actions)
            for view, leaf in zip(self._views.act, leaves):
                np.copyto(view, leaf, casting="unsafe")
            self._start(OP_STEP, "step", None)
        else:
            items = list(iterate(self.action_space, actions))
            if len(items) != self.num_envs:
                raise ValueError(f"actions: {len(items)} actions for num_envs={self.num_envs}")
            self._start(OP_STEP, "step", items)

    def step_wait(self, timeout: float | None = None):
        """The results of the step started by `step_async` (a worker's exception is raised
        here, after gymnasium's log of it; the env is closed then)."""
        outs = self._finish("step", timeout)
        v = self._views
        return (self._observations(outs), v.rew.copy(), v.term.copy(), v.trunc.copy(),
                self._infos(outs))

    # ------------------------------------------------------------------ call, attributes

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method (or read attribute) `name` of every sub-environment."""
        self.call_async(name, *args, **kwargs)
        return self.call_wait()

    def call_async(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Start `call(name, ...)`; `call_wait` collects.  Arguments and results must be
        plain data (numbers, str, bytes, numpy arrays, and containers of them)."""
        self._check_open()
        self._check_idle("call_async")
        if name in _NOT_BY_CALL:
            raise ValueError(f"Trying to call function `{name}` with `call`, use `{name}` "
                             f"directly instead.")
        self._start(OP_CALL, "call", {"name": name, "args": list(args), "kwargs": kwargs})

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """The per-env results of the call started by `call_async`."""
        outs = self._finish("call", timeout)
        results = [None] * self.num_envs
        for out in outs:
            for i, value in out.get("results", ()):
                results[i] = value
        return tuple(results)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute `name` of every sub-environment."""
        return self.call(name)

    def set_attr(self, name: str, values) -> None:
        """Set attribute `name` of the sub-environments: one value each (a list or tuple)
        or one value for all."""
        self._check_open()
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError("Values must be a list or tuple with length equal to the number "
                             f"of environments. Got `{len(values)}` values for "
                             f"{self.num_envs} environments.")
        self._check_idle("set_attr")
        self._start(OP_SETATTR, "set_attr", {"name": name, "values": list(values)})
        self._finish("set_attr", None)

    def render(self):
        """Every sub-environment's `render()`."""
        return self.call("render")

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """The np_random seed of every sub-environment."""
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """Copies of the random generators of the sub-environments."""
        return self.get_attr("np_random")

    # ------------------------------------------------------------------ the round

    def _check_open(self) -> None:
        if self.closed or not self._ready:
            raise ClosedEnvironmentError(f"Trying to operate on `{type(self).__name__}`, "
                                         f"after a call to `close()`.")

    def _check_idle(self, what: str, colon: bool = True) -> None:
        if self._state != "default":
            raise AlreadyPendingCallError(f"Calling `{what}` while waiting for a pending call "
                                          f"to `{self._state}` to complete" + "." * colon,
                                          self._state)

    def _start(self, op: int, what: str, message) -> None:
        self._settle()
        if message is not None:
            self._views.master.write(_encode(message))
        if self.num_workers:
            self._master.post(op)
        if self._share is not None and not self.num_workers:
            self._local = self._share.run(op)
        elif self._share is not None:     # the master's share: stepped in the wait
            self._local_op = op
        self._state = what

    def _finish(self, what: str, timeout: float | None) -> list[dict]:
        """Wait for the round `what`; every worker's message (errors raised)."""
        self._check_open()
        if self._state != what:
            name = {"set_attr": "set_attr"}.get(what, f"{what}_async")
            raise NoAsyncCallError(f"Calling `{what}_wait` without any prior call to "
                                   f"`{name}`.", what)
        self._state = "default"
        if self._share is not None and not self.num_workers:
            out, self._local = self._local, None
            if "errors" in out:
                self._fail([(0, rec) for rec in out["errors"]])
            return [out]
        local = self._run_share() if self._share is not None else {}
        if not self._wait(what, timeout):
            self._orphan = what
            if "errors" in local:
                self._fail([(-1, rec) for rec in local["errors"]])
            raise mp.TimeoutError(f"The call to `{what}_wait` has timed out after "
                                  f"{timeout} second(s).")
        failures = self._master.failures() + [(-1, rec) for rec in local.get("errors", ())]
        if failures:
            self._fail(failures)
        v = self._views
        lengths = v.slots[:self.num_workers, S_OUT_LEN]
        outs = [local] if local else []
        if not lengths.any():
            return outs
        return outs + [read_out(v, int(w)) for w in np.flatnonzero(lengths)]

    def _run_share(self) -> dict:
        """The master's share of the command in flight, while the workers run theirs."""
        op, self._local_op = self._local_op, None
        try:
            return self._share.run(op)
        except Exception as exc:           # an env's own errors come back as records
            return {"errors": [error_record(0, OP_NAMES.get(op, str(op)), exc)]}

    def _settle(self) -> None:
        """A round that timed out is still running: wait for it before the next one."""
        if self._orphan is not None:
            what, self._orphan = self._orphan, None
            self._wait(what, None)
            failures = self._master.failures()
            if failures:
                self._fail(failures)

    def _wait(self, what: str, timeout: float | None) -> bool:
        try:
            return self._master.wait(what, timeout)
        except LockstepError:
            # The round is lost: no half-stepped env goes on.  Workers still inside an
            # env call are not waited for.
            self._grace = 0.2
            self.close()
            raise

    def _fail(self, failures: list) -> None:
        ranges = self._views.layout.ranges() or [(0, self.num_envs)]
        share = self._views.layout.master_envs
        self._grace = 0.2
        self.close()
        raise_failures(failures, ranges, share)

    # ------------------------------------------------------------------ batches

    def _observations(self, outs: list[dict]):
        plan, v = self._obs_plan, self._views
        if plan.fixed:
            leaves = [a.copy() for a in v.obs] if self.copy else v.obs
            return plan.join(leaves)
        if getattr(self, "_obs_items", None) is None:
            self._obs_items = [None] * self.num_envs
            self._obs_out = create_empty_array(self.single_observation_space, self.num_envs)
        for out in outs:
            for i, obs in out.get("obs", ()):
                self._obs_items[i] = obs
        batch = concatenate(self.single_observation_space, self._obs_items, self._obs_out)
        return deepcopy(batch) if self.copy else batch

    def _infos(self, outs: list[dict]) -> dict[str, Any]:
        infos: dict[str, Any] = {}
        for out in outs:
            for i, info in out.get("infos", ()):
                infos = self._add_info(infos, info, i)
        return infos

    def _checked(self, actions) -> list[np.ndarray]:
        """The action leaves as arrays, or an error before any worker sees them."""
        plan = self._act_plan
        if getattr(self, "_checks", None) is None:
            self._checks = action_checks(plan)
        if plan.simple:
            a = np.asarray(actions)
            if a.ndim == 0:
                raise TypeError(f"actions: a scalar {actions!r}; expected one action for each "
                                f"of the {self.num_envs} environments")
            return [self._checks[0](a, self.num_envs)]
        try:
            parts = plan.split(actions)
        except (KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"actions: {type(actions).__name__} does not match "
                             f"{self.action_space} ({exc})") from None
        return [check(np.asarray(p), self.num_envs) for check, p in zip(self._checks, parts)]

    # ------------------------------------------------------------------ closing

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_ready", False) and not getattr(self, "closed", True):
            try:
                self.close()
            except Exception:
                pass

    def close_extras(self, timeout: float | None = None, terminate: bool = False,
                     **kwargs: Any) -> None:
        """Stop the workers: after the pending call (warned about, waited for up to
        `timeout` s) unless `terminate`; then politely, then by force."""
        if self._state != "default" and self._ready:
            logger.warn(f"Calling `close` while waiting for a pending call to `{self._state}` "
                        f"to complete.")
            self._orphan, self._state = self._state, "default"
        if terminate:
            self._grace = 0.0
        self._shutdown(timeout)

    def _shutdown(self, timeout: float | None = None) -> None:
        """Stop the workers (politely, then by force) and release the memory; idempotent."""
        ready, self._ready = self._ready, False
        grace = getattr(self, "_grace", 2.0)
        if self._share is not None:
            self._share.close()
            self._share = None
        pending = self._orphan is not None or (self._master is not None and
                                               self._master.in_flight)
        if pending and ready and grace > 0:
            try:                          # let the round in flight end before CLOSE
                self._master.wait("close", grace if timeout is None else min(grace, timeout))
            except LockstepError:
                pass
        if self._procs:
            alive = [p for p in self._procs if p.exitcode is None]
            if alive and grace > 0:
                try:
                    self._master.post(OP_CLOSE)
                except Exception:
                    pass
                deadline = time.monotonic() + grace
                for p in alive:
                    p.join(max(0.0, deadline - time.monotonic()))
            for p in alive:
                if p.exitcode is None:
                    p.kill()
                    p.join(2.0)
            self._procs = []
        elif self._free is not None and self.num_workers:
            self._master.post(OP_CLOSE)
            try:
                self._master.wait("close", timeout=10.0)
            except LockstepError:
                pass
        if self._views is not None:
            self._views.close()
        self._views = None
        if getattr(self, "_master", None) is not None:
            self._master.v = None              # drop every view before unmapping
        if self._free is not None:
            free, self._free = self._free, None
            free()
        if self._memory is not None:
            memory, self._memory = self._memory, None
            memory.close()


def _encode(message) -> bytes:
    from pal_hpc.envs import codec
    return codec.encode(message, "arguments")
