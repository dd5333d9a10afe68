"""Who does what: rank -> node -> role (actor, learner or both), the communicators that
follow from it, and the device a learner trains on.

`assign_roles` is pure (no MPI) and is what every rank computes from the same gathered
layout, so all ranks agree on every role without further messages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pal_hpc.config import AUTO, ConfigError, check_per_node

if TYPE_CHECKING:  # keep this module importable (and the pure part testable) cheaply
    import torch
    from mpi4py import MPI

    from pal_hpc.config import Config


@dataclass(frozen=True)
class RankRole:
    """One rank's place in the job.  Indices are -1 where the role does not apply.

    `actor_index` / `learner_index` number all actors / learners of the job
    contiguously in world-rank order; the `local_` ones count within the node.
    A rank that is both actor and learner runs the solo mode (a node of one rank).
    """

    rank: int
    node: int
    local_rank: int
    node_size: int
    is_actor: bool
    is_learner: bool
    actor_index: int = -1
    learner_index: int = -1
    local_actor_index: int = -1
    local_learner_index: int = -1

    @property
    def is_solo(self) -> bool:
        """Both actor and learner (the only rank of its node)."""
        return self.is_actor and self.is_learner


def _round_half_up(x: float) -> int:
    # Python's round() goes to even (round(2.5) == 2); half-up is what people expect here.
    return int(math.floor(x + 0.5))


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _resolve(value: float, size: int) -> int | None:
    """A checked per-node count for a node of `size` ranks; None for auto (0)."""
    if value == 0:
        return None
    if value < 1:
        return max(1, _round_half_up(value * size))
    return int(value)


def node_counts(node: int, size: int, actors_per_node: float | str = 0,
                learners_per_node: float | str = 0,
                split: dict[int, tuple[int, int]] | None = None) -> tuple[int, int]:
    """(learners, actors) on node `node` of `size` ranks; (1, 1) for a 1-rank node (solo).

    0 for one count fills the node's ranks left by the other; both 0 gives 1 learner
    up to 4 ranks, else one per 4 ranks (rounded half up), and actors the rest.  When
    a count is "auto", `split` (the planner's {node size: (learners, actors)}) decides.
    Every rank must get a role; raises `ConfigError` naming the field otherwise.
    """
    check_per_node("actors_per_node", actors_per_node)
    check_per_node("learners_per_node", learners_per_node)
    if size < 1:
        raise ValueError(f"node {node} has {size} ranks")
    if size == 1:
        return 1, 1
    if AUTO in (actors_per_node, learners_per_node):
        if split is None or size not in split:
            raise ValueError(f"node {node} of {size} ranks: a per-node count is auto, but "
                             f"the planner's split {split} has no entry for that size")
        learners, actors = split[size]
        if learners < 1 or actors < 1 or learners + actors != size:
            raise ValueError(f"node {node} of {size} ranks: the planner's split gives "
                             f"{_n(learners, 'learner')} and {_n(actors, 'actor')}")
        return learners, actors
    learners = _resolve(learners_per_node, size)
    actors = _resolve(actors_per_node, size)
    # Name the field the user actually set (learners when both or neither were set).
    blame = "actors_per_node" if learners is None and actors is not None else "learners_per_node"
    if learners is None and actors is None:
        learners = 1 if size <= 4 else max(1, _round_half_up(size / 4))
    if learners is None:
        learners = size - actors
    if actors is None:
        actors = size - learners
    if learners < 1 or actors < 1 or learners + actors > size:
        learners, actors = max(learners, 1), max(actors, 1)  # a node needs one of each
        raise ConfigError(f"{blame}: {_n(learners, 'learner')} + {_n(actors, 'actor')} need "
                          f"{learners + actors} ranks per node, but node {node} has {size}")
    if learners + actors < size:
        raise ConfigError(f"actors_per_node: {_n(learners, 'learner')} + {_n(actors, 'actor')} "
                          f"leave {size - learners - actors} of node {node}'s {size} ranks "
                          "without a role; set one of the two counts to 0 (the rest) or auto")
    return learners, actors


def roles_for_layout(layout: list[tuple[int, int]], actors_per_node: float | str = 0,
                     learners_per_node: float | str = 0,
                     split: dict[int, tuple[int, int]] | None = None) -> list[RankRole]:
    """Roles from `layout[world_rank] = (node, local_rank)`; nodes need not be contiguous.

    Node ids must be 0..n-1 and each node's local ranks 0..size-1.  On a node, the first
    `learners` local ranks learn and the rest act.  `split`: see `node_counts`.
    """
    sizes: dict[int, int] = {}
    for node, _ in layout:
        sizes[node] = sizes.get(node, 0) + 1
    if sorted(sizes) != list(range(len(sizes))):
        raise ValueError(f"node ids must be 0..{len(sizes) - 1}, got {sorted(sizes)}")
    locals_seen: dict[int, list[int]] = {}
    for node, local in layout:
        locals_seen.setdefault(node, []).append(local)
    for node, seen in locals_seen.items():
        if sorted(seen) != list(range(sizes[node])):
            raise ValueError(f"node {node}: local ranks must be 0..{sizes[node] - 1}, "
                             f"got {sorted(seen)}")
    counts = {node: node_counts(node, size, actors_per_node, learners_per_node, split)
              for node, size in sorted(sizes.items())}

    roles = []
    n_actors = n_learners = 0
    for rank, (node, local) in enumerate(layout):
        size = sizes[node]
        learners, _ = counts[node]
        if size == 1:
            is_learner = is_actor = True
            local_learner = local_actor = 0
        else:
            is_learner, is_actor = local < learners, local >= learners
            local_learner = local if is_learner else -1
            local_actor = local - learners if is_actor else -1
        roles.append(RankRole(
            rank=rank, node=node, local_rank=local, node_size=size,
            is_actor=is_actor, is_learner=is_learner,
            actor_index=n_actors if is_actor else -1,
            learner_index=n_learners if is_learner else -1,
            local_actor_index=local_actor, local_learner_index=local_learner))
        n_actors += is_actor
        n_learners += is_learner
    return roles


def assign_roles(world_size: int, node_sizes: list[int], actors_per_node: float | str = 0,
                 learners_per_node: float | str = 0,
                 split: dict[int, tuple[int, int]] | None = None) -> list[RankRole]:
    """Roles of all `world_size` ranks; `node_sizes` are contiguous world-rank ranges in order."""
    if any(s < 1 for s in node_sizes) or sum(node_sizes) != world_size:
        raise ValueError(f"node sizes {node_sizes} must be >= 1 and sum to the world size "
                         f"{world_size}")
    layout = [(node, local) for node, size in enumerate(node_sizes) for local in range(size)]
    return roles_for_layout(layout, actors_per_node, learners_per_node, split)


def node_sizes_for(world_size: int, ranks_per_node: int) -> list[int]:
    """Sizes of virtual nodes of `ranks_per_node` ranks over one real node (last may be smaller)."""
    if ranks_per_node < 1:
        raise ConfigError(f"ranks_per_node: virtual nodes need >= 1 rank, got {ranks_per_node}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    full, rest = divmod(world_size, ranks_per_node)
    return [ranks_per_node] * full + ([rest] if rest else [])


def uneven_nodes_note(node_sizes: list[int], ranks_per_node: int) -> str:
    """A line telling the user that `ranks_per_node` did not divide a real node evenly
    ("" when it did, or when the real nodes are used).  Uneven nodes work -- real ones
    can be uneven too, and a 1-rank node runs solo -- but the user should know."""
    if ranks_per_node < 1 or all(size == ranks_per_node for size in node_sizes):
        return ""
    solo = sum(size == 1 for size in node_sizes)
    return (f"pal_hpc: note: ranks_per_node {ranks_per_node} makes uneven virtual nodes of "
            f"{' + '.join(map(str, node_sizes))} ranks"
            + (f"; {_n(solo, 'node')} of 1 rank run{'s' if solo == 1 else ''} solo "
               "(actor and learner on one rank)" if solo else ""))


# ---------------------------------------------------------------------------------------
# MPI.

@dataclass
class Topology:
    """This job's communicators and roles, as seen from one rank.

    `node` is the shared-memory communicator of this rank's (real or virtual) node,
    ordered by world rank; `learners` holds every learner rank of the job (ordered by
    world rank, so its rank is `me.learner_index`) or is `MPI.COMM_NULL` on pure actors.
    `plan` is the start-up planner's decision when a per-node count was auto, else None.
    """

    world: MPI.Comm
    node: MPI.Comm
    learners: MPI.Comm
    roles: list[RankRole]
    me: RankRole
    n_nodes: int
    _freed: bool = field(default=False, repr=False)
    plan: dict | None = field(default=None, repr=False)

    @property
    def node_sizes(self) -> list[int]:
        """Ranks on each node, by node id."""
        sizes = [0] * self.n_nodes
        for r in self.roles:
            sizes[r.node] += 1
        return sizes

    @property
    def n_actors(self) -> int:
        """Actor ranks in the job (solo ranks included)."""
        return sum(r.is_actor for r in self.roles)

    @property
    def n_learners(self) -> int:
        """Learner ranks in the job (solo ranks included)."""
        return sum(r.is_learner for r in self.roles)

    def free(self) -> None:
        """Free the node and learner communicators (collective over each; idempotent)."""
        from mpi4py import MPI

        if self._freed:
            return
        self._freed = True
        if self.learners != MPI.COMM_NULL:
            self.learners.Free()
        self.node.Free()


def build_topology(world: MPI.Comm, cfg: Config, plan: dict | None = None) -> Topology:
    """Collectively split `world` into nodes and learners and assign every rank its role.

    Real nodes come from `Split_type(COMM_TYPE_SHARED)`; with `cfg.ranks_per_node = k > 0`
    each real node is cut into virtual nodes of k consecutive local ranks.  Nodes are
    numbered by their lowest world rank; they need not be contiguous rank ranges.
    A bad layout raises the same `ConfigError` on every rank.  `plan` (from
    `pal_hpc.plan.plan_at_startup`, the same on every rank) decides the "auto" counts:
    its "split" maps a node size to [learners, actors].
    """
    split = ({int(size): tuple(counts) for size, counts in plan["split"].items()}
             if plan else None)
    from mpi4py import MPI

    rank = world.Get_rank()
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    try:
        if cfg.ranks_per_node > 0:
            real = node
            node = real.Split(color=real.Get_rank() // cfg.ranks_per_node, key=rank)
            real.Free()
        # Every rank learns every rank's (node leader, local rank): the layout, identically.
        leader = node.bcast(rank, root=0)
        table = world.allgather((leader, node.Get_rank()))
        node_of_leader = {lead: i for i, lead in enumerate(sorted({lead for lead, _ in table}))}
        layout = [(node_of_leader[lead], local) for lead, local in table]
        roles = roles_for_layout(layout, cfg.actors_per_node, cfg.learners_per_node, split)
    except BaseException:
        node.Free()
        raise
    me = roles[rank]
    learners = world.Split(color=0 if me.is_learner else MPI.UNDEFINED, key=rank)
    return Topology(world=world, node=node, learners=learners, roles=roles, me=me,
                    n_nodes=len(node_of_leader), plan=plan)


def pick_device(cfg_device: str, local_learner_index: int) -> torch.device:
    """The torch device of a learner: its own GPU (round robin over the node's GPUs) or CPU.

    "cuda" without a usable GPU is a configuration error, not a silent fallback.
    """
    import torch

    if cfg_device == "cpu":
        return torch.device("cpu")
    if cfg_device not in ("auto", "cuda"):
        raise ConfigError(f"device: must be one of auto, cpu, cuda; got {cfg_device!r}")
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return torch.device(f"cuda:{max(local_learner_index, 0) % torch.cuda.device_count()}")
    if cfg_device == "cuda":
        raise ConfigError("device: cuda requested but torch.cuda.is_available() is False")
    return torch.device("cpu")
