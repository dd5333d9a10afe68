"""The worker side of the lockstep protocol: `serve`, a worker's loop, and `EnvShare`,
what it does with each command.

`EnvShare` steps the environments [lo, hi) into the shared batch arrays with the vector
env's autoreset mode, exactly as `SyncVectorEnv` steps them, and runs `call` / `set_attr`
on them.  An exception in one environment does not stop the others (as in
`AsyncVectorEnv`, where each env has its own worker): every failing env is reported.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np

from pal_hpc.envs import _lockstep as core
from pal_hpc.envs import codec
from pal_hpc.envs.lockstep_protocol import (
    OP_CALL, OP_CLOSE, OP_NAMES, OP_RESET, OP_SETATTR, OP_STEP, S64_BUSY_NS, S_PID, Backoff,
    LockstepError, Views, error_record, report,
)

NEXT_STEP, SAME_STEP, DISABLED = "NextStep", "SameStep", "Disabled"


class EnvShare:
    """The environments [lo, hi) of one worker (or of the master with no workers)."""

    def __init__(self, envs: Sequence[gym.Env], lo: int, views: Views, spaces=None):
        self.envs = list(envs)
        self.lo, self.hi = lo, lo + len(self.envs)
        self.v = views
        self.mode = views.layout.autoreset
        self.autoreset = np.zeros(len(self.envs), np.bool_)
        env = self.envs[0]
        self._obs = spaces[0] if spaces else _plan(env.observation_space, views.layout.obs_leaves)
        self._act = spaces[1] if spaces else _plan(env.action_space, views.layout.act_leaves)
        self._fast = self.mode == NEXT_STEP and self._obs[0] == self._act[0] == "simple"

    def run(self, op: int) -> dict:
        """Run command `op` on every env of this share; the round's message to the master."""
        if op == OP_STEP:
            acts = None if self.v.act else codec.decode(self.v.master.read())
            return self.step(acts)
        args = codec.decode(self.v.master.read())
        if op == OP_RESET:
            return self.reset(args["seeds"], args["options"], args["mask"])
        if op == OP_CALL:
            return self.call(args["name"], args["args"], args["kwargs"])
        if op == OP_SETATTR:
            return self.set_attr(args["name"], args["values"])
        raise LockstepError(f"unknown command {op}")

    # -- the rows of the batch

    def _put_obs(self, i: int, obs, out: dict) -> None:
        kind, plan = self._obs
        if kind == "simple":
            self.v.obs[0][i] = obs
        elif kind == "leaves":
            for arr, x in zip(self.v.obs, plan.split(obs)):
                arr[i] = x
        else:
            out.setdefault("obs", []).append((i, obs))

    def _action(self, i: int, acts):
        kind, plan = self._act
        if kind == "simple":
            a = self.v.act[0][i]
            return a.copy() if a.ndim else a       # an env may keep its action: never a view
        if kind == "leaves":
            return plan.join([a[i].copy() if a.ndim > 1 else a[i] for a in self.v.act])
        return acts[i]

    # -- the commands

    def reset(self, seeds, options, mask) -> dict:
        v, out = self.v, {}
        for k, env in enumerate(self.envs):
            i = self.lo + k
            if mask is not None and not mask[i]:
                continue
            try:
                obs, info = env.reset(seed=seeds[i], options=options)
            except Exception as exc:
                out.setdefault("errors", []).append(error_record(i, "reset", exc))
                continue
            self._put_obs(i, obs, out)
            v.term[i] = v.trunc[i] = False
            self.autoreset[k] = False
            if info:
                out.setdefault("infos", []).append((i, info))
        return out

    def step(self, acts=None) -> dict:
        if self._fast:
            return self._step_fast()
        v, out, mode = self.v, {}, self.mode
        for k, env in enumerate(self.envs):
            i = self.lo + k
            try:
                if mode == NEXT_STEP and self.autoreset[k]:
                    obs, info = env.reset()
                    r, te, tr = 0.0, False, False
                else:
                    obs, r, te, tr, info = env.step(self._action(i, acts))
                    if mode == SAME_STEP and (te or tr):
                        final_obs, final_info = obs, info
                        obs, info = env.reset()
                        info = {"final_info": final_info, "final_obs": final_obs, **info}
            except Exception as exc:
                out.setdefault("errors", []).append(error_record(i, "step", exc))
                continue
            v.rew[i] = r
            v.term[i] = te
            v.trunc[i] = tr
            self._put_obs(i, obs, out)
            if info:
                out.setdefault("infos", []).append((i, info))
            if mode == NEXT_STEP:
                self.autoreset[k] = te or tr
        return out

    def _step_fast(self) -> dict:
        """`step` for one-array observations and actions with next-step autoreset: the
        common case, kept free of per-env dispatch."""
        v, out = self.v, {}
        obs_rows, act = v.obs[0], v.act[0]
        copy_action = act.ndim > 1          # an env may keep its action: never a shared view
        autoreset = self.autoreset
        for k, env in enumerate(self.envs):
            i = self.lo + k
            try:
                if autoreset[k]:
                    obs, info = env.reset()
                    r, te, tr = 0.0, False, False
                else:
                    obs, r, te, tr, info = env.step(act[i].copy() if copy_action else act[i])
            except Exception as exc:
                out.setdefault("errors", []).append(error_record(i, "step", exc))
                continue
            v.rew[i] = r
            v.term[i] = te
            v.trunc[i] = tr
            obs_rows[i] = obs
            autoreset[k] = te or tr
            if info:
                out.setdefault("infos", []).append((i, info))
        return out

    def call(self, name: str, args, kwargs) -> dict:
        out = {}
        for k, env in enumerate(self.envs):
            i = self.lo + k
            try:
                attr = env.get_wrapper_attr(name)
                value = attr(*args, **kwargs) if callable(attr) else attr
            except Exception as exc:
                out.setdefault("errors", []).append(error_record(i, f"call({name!r})", exc))
                continue
            out.setdefault("results", []).append((i, value))
        return out

    def set_attr(self, name: str, values) -> dict:
        out = {}
        for k, env in enumerate(self.envs):
            i = self.lo + k
            try:
                env.set_wrapper_attr(name, values[i])
            except Exception as exc:
                out.setdefault("errors", []).append(error_record(i, f"set_attr({name!r})", exc))
        return out

    def close(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception:
                pass


class SpaceCheck:
    """Raises RuntimeError if a sub-environment's spaces are not the vector env's (those of
    env 0), as AsyncVectorEnv does: a batch needs one space."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space):
        self.obs, self.act = observation_space, action_space

    def __call__(self, i: int, env: gym.Env) -> None:
        for what, mine, want in (("observation", env.observation_space, self.obs),
                                 ("action", env.action_space, self.act)):
            if mine != want:
                raise RuntimeError(f"LockstepVectorEnv: env {i}'s {what} space {mine} is not "
                                   f"{want}, env 0's; in order to batch them, the {what} "
                                   f"spaces of all environments must be equal")


def _plan(space: gym.Space, leaves: tuple):
    """How this share writes (observations) or reads (actions) one env's value."""
    from pal_hpc.envs.lockstep_spaces import FIXED_LEAVES, SpacePlan

    if not leaves:
        return "coded", None
    if isinstance(space, FIXED_LEAVES):
        return "simple", None
    return "leaves", SpacePlan(space, 1)


def serve(views: Views, w: int, env_fns: Sequence[Callable[[], gym.Env]],
          backoff: Backoff, master_alive: Callable[[], bool],
          check: Callable[[int, gym.Env], None] | None = None,
          built: Callable[[], None] | None = None, share: Callable = EnvShare) -> None:
    """Worker `w`'s loop: build its environments (`check(i, env)` raises if env i does not
    match the vector env's spaces; `built()` runs after), then run commands until CLOSE.
    `share(objects, lo, views)` makes what runs the commands: `EnvShare` for
    environments, `pal_hpc.envs.lockstep_agent_share.PolicyShare` for agents' policies.

    Exceptions from the environments go back to the master with their traceback; this
    function returns on CLOSE, or when `master_alive()` says the master is gone."""
    ctl = views.control
    views.slots[w, S_PID] = os.getpid()
    lo, hi = views.layout.ranges()[w]
    make_share, share, errors = share, None, []
    try:
        envs = []
        for k, fn in enumerate(env_fns):
            try:
                envs.append(fn())
                if check is not None:
                    check(lo + k, envs[-1])
            except Exception as exc:
                errors.append(error_record(lo + k, "start-up", exc))
        if not errors and len(envs) != hi - lo:
            raise LockstepError(f"worker {w} built {len(envs)} environments, expected {hi - lo}")
        if not errors:
            share = make_share(envs, lo, views)
            if built is not None:
                built()
        else:
            for env in envs:
                env.close()
    except Exception as exc:
        errors.append(error_record(lo, "start-up", exc))
    report(views, w, {"errors": errors} if errors else {})
    last = core.command_seq(ctl)       # before `done`: the master may post right after it
    core.done(ctl)
    try:
        while True:
            cmd = core.wait_command(ctl, last, backoff.spin_ns, backoff.yield_ns,
                                    backoff.check_ns)
            if cmd is None:
                if not master_alive():
                    return
                continue
            last, op, _ = cmd
            t0 = time.perf_counter_ns()
            if op == OP_CLOSE:
                core.done(ctl)
                return
            if share is None:             # could not build: the master already knows
                core.done(ctl)
                continue
            try:
                out = share.run(op)
            except Exception as exc:
                out = {"errors": [error_record(share.lo, OP_NAMES.get(op, str(op)), exc)]}
            report(views, w, out)
            views.slots64[w, S64_BUSY_NS] += time.perf_counter_ns() - t0
            core.done(ctl)
    finally:
        if share is not None:
            share.close()
        views.out[w].close()
