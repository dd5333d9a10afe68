"""Resuming a checkpoint on another rank layout: what each rank of the new job takes
of the old job's counters, the RNG streams derived for it, and the start-up line that
says what changed.  Pure functions (no MPI, no files), so they are tested alone.

A layout is the checkpoint's `layout` attribute, one [node, is_actor, is_learner] per
world rank.  When it equals the new job's, every rank continues its own saved state,
bit for bit, as before.  When it differs, no old rank is a new one -- rank r may sit on
another node, in another role, writing another region -- so:

- the job-wide counters are kept exactly: the env steps are dealt out over the new
  actors (their sum is the checkpoint's), the updates sit with learner 0 (every
  learner resumes at the checkpoint's update), and the rest (episodes, and the
  per-round sums not yet sent) with the evaluator, actor 0;
- the evaluation schedule is the old evaluator's (its next evaluation step);
- every RNG stream (the actor's exploration, the learner's sampling, torch's, the
  environments' reset seeds) is derived from (seed, checkpoint update, new world
  rank) with numpy's SeedSequence: two resumes of one checkpoint on one layout draw
  the same numbers.
"""

from __future__ import annotations

import numpy as np

from pal_hpc.runtime import stats as S

# SeedSequence words that keep the derived streams apart from each other and from the
# streams a fresh start seeds ([seed, 1, learner] for the learners' samplers).
RESUME_STREAM = 7
ACTOR_RNG, LEARNER_RNG, TORCH_RNG, ENV_SEEDS = range(4)
# Counters a rank sets afresh (its replay's size and capacity) or that are requests of
# the old run (stop, preemption, checkpoints): not carried over.
NOT_CARRIED = (S.REPLAY_SIZE, S.REPLAY_CAPACITY, S.STOP, S.PREEMPT, S.CHECKPOINTS)


def evaluator_rank(layout: list) -> int:
    """World rank of actor 0 (the evaluator) in a layout."""
    return next(rank for rank, (_, is_actor, _) in enumerate(layout) if is_actor)


def carried_counters(saved: list[np.ndarray], layout: list, now: list, rank: int,
                     mine: np.ndarray) -> tuple[np.ndarray, int]:
    """New rank `rank`'s counters (a copy of `mine`, its fresh ones, with the carried
    slots filled in) and its actor steps, from every old rank's saved counters.

    `now` is the new layout; the sums over the new ranks of every carried slot equal
    the sums over the old ranks."""
    total = np.sum(saved, axis=0) if len(saved) else np.zeros(S.SIZE)
    out = np.array(mine, dtype=np.float64, copy=True)
    actors = [r for r, (_, is_actor, _) in enumerate(now) if is_actor]
    learner0 = next(r for r, (_, _, is_learner) in enumerate(now) if is_learner)
    evaluator = actors[0]
    steps = 0
    for slot in range(S.SIZE):
        if slot in NOT_CARRIED:
            continue
        if slot == S.ENV_STEPS:
            if rank in actors:
                steps = dealt(int(round(total[slot])), len(actors), actors.index(rank))
            out[slot] = steps
        elif slot == S.UPDATES:
            out[slot] = total[slot] if rank == learner0 else 0.0
        else:
            out[slot] = total[slot] if rank == evaluator else 0.0
    return out, steps


def dealt(total: int, parts: int, i: int) -> int:
    """Part i of `total` dealt into `parts` near-equal integers (the first ones larger)."""
    q, r = divmod(total, parts)
    return q + (i < r)


def derived_seed(seed: int, update: int, rank: int, stream: int) -> np.random.SeedSequence:
    """The seed of one derived RNG stream of new rank `rank` (see the module docstring)."""
    return np.random.SeedSequence([seed, RESUME_STREAM, update, rank, stream])


def derived_rng(seed: int, update: int, rank: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(derived_seed(seed, update, rank, stream))


def derived_torch_seed(seed: int, update: int, rank: int) -> int:
    """A 63-bit torch seed for new rank `rank`."""
    words = derived_seed(seed, update, rank, TORCH_RNG).generate_state(2, np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])


def derived_env_seeds(seed: int, update: int, rank: int, n: int) -> list[int]:
    """Reset seeds for the new rank's `n` environments."""
    return [int(s) for s in derived_seed(seed, update, rank, ENV_SEEDS).generate_state(n)]


def describe_layout(layout: list) -> str:
    """"2 nodes x 3 ranks (4 actors, 2 learners)", or "2 nodes of 4+2 ranks (...)"."""
    sizes: dict[int, int] = {}
    for node, _, _ in layout:
        sizes[node] = sizes.get(node, 0) + 1
    per = [sizes[n] for n in sorted(sizes)]
    nodes = f"{len(per)} node{'s' if len(per) != 1 else ''}"
    shape = (f"{nodes} x {per[0]} rank{'s' if per[0] != 1 else ''}" if len(set(per)) == 1
             else f"{nodes} of {'+'.join(map(str, per))} ranks")
    actors = sum(bool(a) for _, a, _ in layout)
    learners = sum(bool(lr) for _, _, lr in layout)
    return (f"{shape} ({actors} actor{'s' if actors != 1 else ''}, "
            f"{learners} learner{'s' if learners != 1 else ''})")


def replay_note(saved_rows: int, kept_rows: int, placed: int, transitions: tuple | None,
                ) -> str:
    """The start-up line's replay part: "replay 600,000 -> 300,000 rows kept: 300,000
    oldest dropped" (for a frame replay also the samplable transitions, before and
    after, and the context rows copied)."""
    note = f"replay {saved_rows:,} -> {kept_rows:,} rows kept"
    note += (f": {saved_rows - kept_rows:,} oldest dropped" if kept_rows < saved_rows
             else ": all of them")
    if transitions is not None:
        before, after = transitions
        note += (f"; {after:,} of {before:,} samplable transitions"
                 + (f", {placed - kept_rows:,} rows copied as stack context"
                    if placed > kept_rows else ""))
    return note
