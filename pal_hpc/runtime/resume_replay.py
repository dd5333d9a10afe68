"""The replay side of a resume, for `Checkpointing`: each node loads its own saved
buffer (the same layout and buffers), or every node's first rank loads its share of
the union of the saved buffers (another layout: `pal_hpc.replay.resplit`); and the
check that a saved replay holds rows this run's buffer can hold."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from pal_hpc.config import ConfigError
from pal_hpc.io import checkpoint as ckpt
from pal_hpc.replay.resplit import plan_resplit
from pal_hpc.replay.resplit_load import carried_samples, load_resplit
from pal_hpc.replay.shards import ShardError, open_shard
from pal_hpc.runtime import resume_layout as RL


def load_own_replay(replay, me, main: Path, replay_files: dict) -> None:
    """The same layout and buffers: each node loads its own saved buffer as it was."""
    replay_file = ckpt.replay_file_of(main, replay_files, me.node)
    if me.local_rank == 0 and replay_file is not None:
        with h5py.File(replay_file, "r") as rf:
            group = rf["replay"]
            replay.load_state_arrays({name: group[name] for name in group})


def resplit_replay(world, me, replay, main: Path, replay_files: dict, layout: list,
                   node_replays: list, ratio: float) -> str:
    """Another layout (or buffer): every node's first rank loads its share of the union
    of the saved buffers.  `node_replays` holds (node, signature, ring lengths) of every
    new node.  Collective over `world`; an error on any node is raised on every rank.
    Returns the start-up line's replay note (on rank 0; "" elsewhere)."""
    err, done, note = "", (0, 0), None
    if me.local_rank == 0:
        shards = []
        try:
            paths = [ckpt.replay_file_of(main, replay_files, node)
                     for node in sorted({n for n, _, _ in layout})]
            if any(p is None for p in paths):
                raise ShardError(f"{main}: lists no replay file for some node of its layout "
                                 f"({sorted(replay_files)})")
            shards = [open_shard(p) for p in paths]
            frames = ((replay.frames.stack, replay.n_step) if hasattr(replay, "stack_name")
                      else None)
            plan = plan_resplit([[r.rows for r in s.rings] for s in shards],
                                [lengths for _, _, lengths in node_replays], frames)
            pieces = plan.rings[me.node]
            placed = sum(p.size for ring in pieces for p in ring)
            got = load_resplit(replay, pieces, shards, carried_samples(shards, placed, ratio))
            done = (got["rows"], got["transitions"])
            before = (sum(int(np.count_nonzero(r.prio)) for s in shards for r in s.rings)
                      if frames else None)
            note = (plan, before)
        except (ShardError, ValueError, OSError) as exc:
            err = f"resume: {exc}"
        finally:
            for shard in shards:
                shard.close()
    results = world.allgather((err, done))
    errors = [e for e, _ in results if e]
    if errors:
        raise ConfigError(errors[0])
    if note is None:
        return ""
    plan, before = note
    placed = sum(rows for _, (rows, _) in results)
    after = sum(t for _, (_, t) in results)
    return RL.replay_note(plan.saved_rows, plan.kept_rows, placed,
                          (before, after) if before is not None else None)


def check_replay_kind(then: dict, now: dict) -> None:
    """Refuse a saved replay (signature `then`) whose rows this run's replay (signature
    `now`) cannot hold, naming the field that decides it."""
    if ("streams" in then) != ("streams" in now):
        kinds = ["frames stored once" if "streams" in s else "whole transitions"
                 for s in (then, now)]
        raise ConfigError(f"frame_dedup: the checkpoint's replay holds {kinds[0]}, this run's "
                          f"holds {kinds[1]}; resuming would change the observation layout")
    for key, field in (("spec", "env"), ("stack", "env"), ("n_step", "n_step")):
        if then.get(key) != now.get(key):
            raise ConfigError(f"{field}: the checkpoint's replay stores {key} "
                              f"{then.get(key)!r}, this run's {now.get(key)!r}; resuming "
                              f"would change the observation layout")
