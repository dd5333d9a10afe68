"""The plan at start-up (`--actors-per-node auto` / `--learners-per-node auto`): rank 0
measures, the job's ranks time their Allreduce, every rank gets the same plan."""

from __future__ import annotations

import dataclasses
import json
import os

from pal_hpc.config import ConfigError
from pal_hpc.plan.measure import details, gang_rows, measure_rates
from pal_hpc.plan.probe import measure_gang, measure_sync, sync_counts
from pal_hpc.plan.model import AUTO, Layout, all_splits, make_plan, others_from_share



def layout_from_table(table: list[tuple[int, int, int]], ranks_per_node: int = 0
                      ) -> tuple[Layout, list[int]]:
    """The Layout from `table[world_rank] = (host leader rank, rank on the host, host
    cores)`, with virtual nodes of `ranks_per_node` as `build_topology` cuts them, and
    the ranks in the order learners fill them (first rank of every node, then the
    second...), for measure_sync.  Nodes are numbered by their lowest world rank."""
    key_of = [(lead, local // ranks_per_node if ranks_per_node > 0 else 0)
              for lead, local, _ in table]
    leaders = sorted({key: min(r for r, k in enumerate(key_of) if k == key)
                      for key in set(key_of)}.items(), key=lambda kv: kv[1])
    node_of = {key: i for i, (key, _) in enumerate(leaders)}
    host_leaders = sorted({lead for lead, _, _ in table})
    host_of = {lead: i for i, lead in enumerate(host_leaders)}
    cores = [0.0] * len(host_leaders)
    for lead, _, c in table:
        cores[host_of[lead]] = float(c)
    sizes, hosts = [0] * len(node_of), [0] * len(node_of)
    position = []
    for r, key in enumerate(key_of):
        node = node_of[key]
        position.append((sizes[node], node, r))
        sizes[node] += 1
        hosts[node] = host_of[key[0]]
    order = [r for _, _, r in sorted(position)]
    return Layout(tuple(sizes), tuple(hosts), tuple(cores)), order


def _host_table(world) -> list[tuple[int, int, int]]:
    """Collective: every rank's (host leader, rank on the host, the host's cores)."""
    from mpi4py import MPI

    rank = world.Get_rank()
    host = world.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    try:
        cpus = set().union(*host.allgather(sorted(os.sched_getaffinity(0))))
        leader = host.bcast(rank, root=0)
        local = host.Get_rank()
    finally:
        host.Free()
    return world.allgather((leader, local, len(cpus)))


def split_from_checkpoint(cfg, layout: Layout) -> tuple[tuple[int, ...], str] | None:
    """The learners per node of the checkpoint a resume will read (newest first), if
    it fits this layout: a resumed run keeps the split it started with (its replay
    regions and roles must match).  None when there is none or it does not fit."""
    import h5py

    from pal_hpc.io import checkpoint as ckpt

    if cfg.resume in ("latest", "auto"):
        paths = list(reversed(ckpt.list_checkpoints(cfg.resolved_run_dir())))
    else:
        paths = [cfg.resume]
    for path in paths:
        try:
            with h5py.File(path, "r") as f:
                saved = json.loads(f.attrs["layout"])      # [[node, is_actor, is_learner]]
        except (OSError, KeyError, ValueError):
            continue
        counts: dict[int, list[int]] = {}
        for node, _, is_learner in saved:
            counts.setdefault(node, [0, 0])
            counts[node][0] += 1
            counts[node][1] += int(is_learner)
        by_size: dict[int, int] = {}
        for size, n in counts.values():
            by_size.setdefault(size, n)
            if by_size[size] != n:
                return None
        if sorted(size for size, _ in counts.values()) != sorted(layout.sizes) \
                or any(by_size[s] >= s for s in by_size if s > 1):
            return None
        return tuple(by_size[s] for s in layout.sizes), str(path)
    return None


def plan_at_startup(world, cfg) -> dict | None:
    """Collective: the plan when a per-node count is auto, else None (nothing done).

    Rank 0 measures (the others sleep), the Allreduce cost is measured among the job's
    ranks, rank 0 decides and every rank gets the same plan: build_topology takes its
    "split".  A resumed run keeps its checkpoint's split.  Rank 0 prints one line."""
    if AUTO not in (cfg.actors_per_node, cfg.learners_per_node):
        return None
    from pal_hpc.cluster.collectives import wait_all

    rank = world.Get_rank()
    layout, order = layout_from_table(_host_table(world), cfg.ranks_per_node)
    splits = all_splits(layout, cfg.actors_per_node, cfg.learners_per_node)  # same everywhere
    measured = err = kept = None
    if rank == 0:
        try:
            kept = split_from_checkpoint(cfg, layout) if cfg.resume else None
            measured = measure_rates(cfg)
        except ConfigError as exc:
            err = str(exc)
    wait_all(world)                           # the others sleep while rank 0 measures
    counts = sync_counts(layout, splits)
    split = cfg.learner_batch == "split"
    cpu = measured is not None and measured.device == "cpu"   # g(L): CPU learners only
    err, floats, cpu = world.bcast(
        (err, measured.gradient_floats if measured else 0, cpu), root=0)
    if err:
        raise ConfigError(err)
    sync = measure_sync(world, counts, floats, order)
    gang = (measure_gang(world, counts, cfg, gang_rows(counts, cfg.batch_size, split), order)
            if cpu else {})
    plan = None
    if rank == 0:
        measured.sync_s, measured.gang_s = sync, gang
        # Other programs' load is seen on rank 0's host (host 0) only.
        layout = dataclasses.replace(layout, others=tuple(
            others_from_share(c, measured.cpu_share) if h == 0 else 0.0
            for h, c in enumerate(layout.cores)))
        plan = make_plan(layout, measured.rates(), cfg.batch_size, cfg.replay_ratio,
                         cfg.actors_per_node, cfg.learners_per_node,
                         forced=kept[0] if kept else None,
                         split=split)
        plan["inputs"].update(details(measured), envs_per_actor=cfg.envs_per_actor)
        plan["source"] = f"checkpoint {kept[1]}" if kept else "measured"
        print(f"pal_hpc: plan: {plan['describe']}"
              + (f" (kept from {kept[1]})" if kept else "")
              + f"; predicted {plan['env_steps_per_s']:,.0f} env steps/s, "
                f"{plan['updates_per_s']:,.0f} updates/s, {plan['bottleneck']} the limit "
                f"(measured in {measured.measure_s:.1f} s; python -m pal_hpc.plan shows "
                "every split)", flush=True)
    return world.bcast(plan, root=0)
