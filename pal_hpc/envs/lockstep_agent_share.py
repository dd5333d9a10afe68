"""The agents' side of `pal_hpc.envs.lockstep_agents.LockstepAgents`: how each agent's
observation and action sit in the shared batch arrays (`AgentRows`), and `PolicyShare`,
what a lockstep worker does with its agents' policies each round.

The shared block is the lockstep protocol's own (`pal_hpc.envs.lockstep_protocol.Layout`)
with one row per agent of the env's `possible_agents`: observation leaf 0 holds each
agent's observation (flattened, in one common dtype, padded to the widest agent),
observation leaf 1 says which agents are live this round (PettingZoo removes agents that
are done), and action leaf 0 receives each live agent's action.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from gymnasium import spaces

from pal_hpc.envs import codec
from pal_hpc.envs.lockstep_protocol import OP_CALL, OP_STEP, LockstepError, Views, error_record


@dataclass(frozen=True)
class AgentRows:
    """Each agent's observation and action shapes and dtypes, and the shared rows they
    live in.  Plain data (it travels to spawned workers and MPI ranks)."""

    agents: tuple                  # the env's possible_agents, in order: row i is agent i
    obs_shapes: tuple
    obs_dtypes: tuple              # str per agent
    obs_dtype: str                 # the common dtype of the shared observation rows
    discrete: bool                 # every action space Discrete (else every one a Box)
    act_shapes: tuple
    act_dtypes: tuple
    act_dtype: str

    @staticmethod
    def of(env) -> "AgentRows":
        """The rows of a PettingZoo ParallelEnv; ValueError naming the agent and the
        space that does not fit a fixed row."""
        agents = tuple(getattr(env, "possible_agents", None) or ())
        if not agents:
            raise ValueError(f"env: {type(env).__name__} has no possible_agents; a "
                             f"PettingZoo ParallelEnv lists its agents there")
        obs, act = [], []
        for agent in agents:
            o, a = env.observation_space(agent), env.action_space(agent)
            if not isinstance(o, spaces.Box) or any(d is None for d in o.shape):
                raise ValueError(f"observation_space({agent!r}): {o}; LockstepAgents needs "
                                 f"a fixed-shape Box for every agent")
            if not isinstance(a, (spaces.Discrete, spaces.Box)):
                raise ValueError(f"action_space({agent!r}): {a}; LockstepAgents needs a "
                                 f"Discrete or a fixed-shape Box action for every agent")
            obs.append(o)
            act.append(a)
        discrete = [isinstance(a, spaces.Discrete) for a in act]
        if any(discrete) and not all(discrete):
            first = agents[discrete.index(not discrete[0])]
            raise ValueError(f"action_space({first!r}): {env.action_space(first)}; every "
                             f"agent's action space must be Discrete, or every one a Box")
        a_dtype = np.dtype(np.int64) if discrete[0] else np.result_type(*[a.dtype for a in act])
        return AgentRows(
            agents=agents, obs_shapes=tuple(tuple(o.shape) for o in obs),
            obs_dtypes=tuple(o.dtype.str for o in obs),
            obs_dtype=np.result_type(*[o.dtype for o in obs]).str, discrete=discrete[0],
            act_shapes=tuple(() if d else tuple(a.shape) for d, a in zip(discrete, act)),
            act_dtypes=tuple(a_dtype.str if d else a.dtype.str for d, a in zip(discrete, act)),
            act_dtype=a_dtype.str)

    @property
    def obs_leaves(self) -> tuple:
        width = max(int(np.prod(s, dtype=np.int64)) for s in self.obs_shapes)
        return (((width,), self.obs_dtype), ((), "|b1"))

    @property
    def act_leaves(self) -> tuple:
        if self.discrete:
            return (((), self.act_dtype),)
        width = max(int(np.prod(s, dtype=np.int64)) for s in self.act_shapes)
        return (((width,), self.act_dtype),)

    def obs_row(self, views: Views, i: int) -> np.ndarray:
        """Agent i's observation in its shared row, shaped as its space (a view)."""
        shape = self.obs_shapes[i]
        return views.obs[0][i, :int(np.prod(shape, dtype=np.int64))].reshape(shape)

    def act_row(self, views: Views, i: int) -> np.ndarray:
        """Agent i's action in its shared row: a 0-d view for Discrete actions."""
        if self.discrete:
            return views.act[0][i:i + 1].reshape(())
        shape = self.act_shapes[i]
        return views.act[0][i, :int(np.prod(shape, dtype=np.int64))].reshape(shape)

    def action(self, row: np.ndarray, i: int):
        """Agent i's action as the env takes it: an int, or an array of its space's dtype."""
        if self.discrete:
            return int(row)
        return row.astype(self.act_dtypes[i], copy=True)


class PolicyShare:
    """The policies of agents [lo, hi): each round, every live agent's policy maps its
    observation (read in place from the shared row, read-only, valid during the call)
    to its action, written into its shared action row."""

    def __init__(self, rows: AgentRows, policies: Sequence, lo: int, views: Views):
        self.rows, self.policies, self.v = rows, list(policies), views
        self.lo, self.hi = lo, lo + len(self.policies)
        self.live = views.obs[1]
        self._obs, self._act = [], []
        for i in range(self.lo, self.hi):
            view = rows.obs_row(views, i)
            view.flags.writeable = False
            own = np.dtype(rows.obs_dtypes[i])
            self._obs.append((view, None if own == view.dtype else own))
            self._act.append(rows.act_row(views, i))

    def run(self, op: int) -> dict:
        """Run command `op` on this share's agents; the round's message to the master."""
        if op == OP_STEP:
            return self.step()
        if op == OP_CALL:
            args = codec.decode(self.v.master.read())
            return self.call(args["name"], args["args"], args["kwargs"])
        raise LockstepError(f"unknown command {op} for agents' policies")

    def step(self) -> dict:
        out, live, lo = {}, self.live, self.lo
        for k, policy in enumerate(self.policies):
            if not live[lo + k]:
                continue
            obs, cast = self._obs[k]
            try:
                self._act[k][...] = policy(obs if cast is None else obs.astype(cast))
            except Exception as exc:
                out.setdefault("errors", []).append(error_record(lo + k, "policy", exc))
        return out

    def call(self, name: str, args, kwargs) -> dict:
        """policy.name(*args, **kwargs) (or the attribute) of every agent of the share."""
        out = {}
        for k, policy in enumerate(self.policies):
            try:
                attr = getattr(policy, name)
                value = attr(*args, **kwargs) if callable(attr) else attr
            except Exception as exc:
                out.setdefault("errors", []).append(
                    error_record(self.lo + k, f"call({name!r})", exc))
                continue
            out.setdefault("results", []).append((self.lo + k, value))
        return out

    def close(self) -> None:
        for policy in self.policies:
            close = getattr(policy, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:
                    pass
