"""Checkpoints of a running job, and resuming one (the file formats: `pal_hpc.io.checkpoint`).

`Checkpointing` is a part of `RankRun` (a mixin): its methods run on the rank's state
-- cfg, topo, the algorithm in `learner`, `actor`, `replay`, `stats`, `coord`,
`next_eval`, `pruner` and `last_good` -- and keep the checkpoint logic in one file.
Writing is collective over every rank, at a safe point; resuming restores every
rank's share: parameters, optimizers, counters, RNG states and each node's replay.
A checkpoint of another layout resumes too: the replay is re-split over the new nodes
(`pal_hpc.replay.resplit`) and what belonged to old ranks is carried over or derived
(`pal_hpc.runtime.resume_layout`).
"""

from __future__ import annotations

import json
import secrets
import sys
import time
import warnings
from pathlib import Path

import h5py
import numpy as np

from pal_hpc.cluster.collectives import on_rank0, wait_all
from pal_hpc.config import ConfigError
from pal_hpc.config_io import config_to_dict
from pal_hpc.io import checkpoint as ckpt
from pal_hpc.replay.shards import write_shard
from pal_hpc.runtime import resume_layout as RL
from pal_hpc.runtime import resume_replay as RR
from pal_hpc.runtime import stats as S
from pal_hpc.runtime.coordinator import wall_budget_used


def torch_module():
    """torch, on the ranks that use it (`RankRun.uses_torch`, an on-policy job's
    masters): an actor rank with a numpy policy and an environment worker never import
    it."""
    import torch

    return torch


class Checkpointing:
    """Checkpoint and resume methods of `RankRun` (see the module docstring)."""

    def _checkpoint(self, totals: np.ndarray) -> str | None:
        """Collective over every rank, at a safe point (learners paused after the same
        step, actors between steps): replay files by each node's first rank, then the
        main file by rank 0.  Returns the main file's path on every rank, or None when
        a file could not be written: that is reported, what was written of this
        checkpoint is removed, and the previous checkpoint stays the newest."""
        cfg, world, me = self.cfg, self.ckpt_comm, self.me
        wait_all(world)               # nobody on the node touches the replay from here on
        step = self.learner.updates if self.learner is not None else 0
        # A new tag per checkpoint: rewriting step N never replaces the replay files
        # an existing step_N.h5 verifies against.
        step, tag = world.bcast((step, secrets.token_hex(4)), root=0)
        main = ckpt.main_path(cfg.resolved_run_dir(), step)
        replay_file = ("", "", "")    # (name, checksum, error)
        if cfg.checkpoint_replay and me.local_rank == 0:
            path = ckpt.replay_path(main, me.node, tag)
            state = self.replay.state_arrays()
            try:
                replay_file = (path.name, ckpt.write_atomic(
                    path, lambda f: self._fill_replay(f, state),
                    expected_bytes=sum(a.nbytes for a in state.values())), "")
            except OSError as exc:
                replay_file = ("", "", f"node {me.node}'s replay: {exc}")
        gathered = world.gather((self._rank_state(), replay_file), root=0)
        written = None
        if world.Get_rank() == 0:
            errors = [err for _, (_, _, err) in gathered if err]
            replay_files = {name: digest for _, (name, digest, _) in gathered if name}
            if not errors:
                try:
                    self._write_main(main, step, totals, [s for s, _ in gathered], replay_files)
                    written = str(main)
                except OSError as exc:
                    errors.append(str(exc))
            if written:
                self._after_checkpoint(main)
            else:
                for name in replay_files:
                    main.with_name(name).unlink(missing_ok=True)
                print(f"pal_hpc: error: checkpoint at update {step} not written: "
                      f"{'; '.join(errors)}; the newest checkpoint is still "
                      f"{self.last_good or 'none'}", file=sys.stderr, flush=True)
        written = world.bcast(written, root=0)
        wait_all(world)
        return written

    def _after_checkpoint(self, main: Path) -> None:
        """Rank 0: note the new checkpoint and prune (a failure here costs no checkpoint)."""
        self.last_good = str(main)
        self.pruner.mark_good(main)
        try:
            for note in self.pruner.prune():
                print(f"pal_hpc: {note}", flush=True)
        except OSError as exc:
            print(f"pal_hpc: warning: pruning checkpoints failed: {exc}", file=sys.stderr,
                  flush=True)

    def _fill_replay(self, f: h5py.File, state: dict) -> None:
        """A node's replay file: the buffer's signature and its written rows only."""
        f.attrs["format"] = ckpt.FORMAT_VERSION
        write_shard(f, self.replay.signature(), state)

    def _rank_state(self) -> dict:
        actor = self.actor
        return {
            "rank": self.world.Get_rank(),
            "actor_steps": actor.steps if actor is not None else 0,
            "stats": self.stats.mine.tolist(),
            "np_rng": json.dumps(actor.rng.bit_generator.state) if actor is not None else "",
            "learner_rng": (json.dumps(self.learner.rng.bit_generator.state)
                            if self.learner is not None else ""),
            # An actor rank without torch (a numpy policy) has no generator to save.
            "torch_rng": (torch_module().get_rng_state().numpy() if self.uses_torch
                          else np.zeros(0, np.uint8)),
            "next_eval": float(self.next_eval),
        }

    def _write_main(self, main: Path, step: int, totals, states: list, replay_files: dict) -> None:
        cfg, learner = self.cfg, self.learner
        layout = [[r.node, r.is_actor, r.is_learner] for r in self.topo.roles]
        evals = self.coord.evals if self.coord is not None else []

        def fill(f):
            a = f.attrs
            a["format"] = ckpt.FORMAT_VERSION
            a["updates"] = step
            a["env_steps"] = int(totals[S.ENV_STEPS])
            a["wall_s"] = time.monotonic() - self.start
            a["config"] = json.dumps(config_to_dict(cfg))
            a["layout"] = json.dumps(layout)
            a["evals"] = json.dumps(evals)
            a["replay_files"] = json.dumps(replay_files)
            a["params_digest"] = learner.algo.digest()
            a["algo_signature"] = json.dumps(learner.algo.signature())
            ckpt.save_tree(f.create_group("algo"), learner.algo.state_dict())
            ranks = f.create_group("ranks")
            for st in states:
                g = ranks.create_group(f"rank_{st['rank']}")
                g.create_dataset("torch_rng", data=st["torch_rng"])
                g.attrs["actor_steps"] = st["actor_steps"]
                g.attrs["stats"] = json.dumps(st["stats"])
                g.attrs["np_rng"] = st["np_rng"]
                g.attrs["learner_rng"] = st["learner_rng"]
                g.attrs["next_eval"] = st["next_eval"]
        ckpt.write_atomic(main, fill, in_memory=True)     # networks + optimizer: tens of MB at most

    def _resume(self) -> None:
        """Restore parameters, optimizer, counters, RNG states and replay buffers.  On
        another layout the replay is re-split over the new nodes and what belonged to
        old ranks is carried or derived (`pal_hpc.runtime.resume_layout`)."""
        world, me = self.world, self.me
        # Each node's replay as laid out here: rank 0 compares them with the
        # checkpoint's, and every node's first rank plans a re-split from all of them.
        mine = ((me.node, self.replay.signature(), list(self.replay._ring_bounds()[1]))
                if me.local_rank == 0 else None)
        self.node_replays = sorted((x for x in world.allgather(mine) if x is not None),
                                   key=lambda x: x[0])
        found = world.bcast(on_rank0(world, lambda: self._find_checkpoint(self._check_fits)),
                            root=0)
        if found is None:
            return
        found, direct = found
        now = self._layout_now()
        with h5py.File(found, "r") as f:
            layout = json.loads(f.attrs["layout"])
            step = int(f.attrs["updates"])
            if self.learner is not None:
                self.learner.algo.load_state_dict(ckpt.load_tree(f["algo"]))
                self.learner.updates = step
                if self.learner.weights is not None:
                    self.learner.weights.publish(self.learner.algo.policy_params())
            if layout == now:
                self._restore_rank(f[f"ranks/rank_{world.Get_rank()}"])
            else:
                self._carry_ranks(f, layout, now)
            self.restored = {"wall_s": float(f.attrs["wall_s"]),
                             "evals": json.loads(f.attrs["evals"]),
                             "env_steps": int(f.attrs["env_steps"])}
            replay_files = json.loads(f.attrs["replay_files"])
        note = ""
        if replay_files and direct:
            RR.load_own_replay(self.replay, me, Path(found), replay_files)
        elif replay_files:
            note = RR.resplit_replay(world, me, self.replay, Path(found), replay_files,
                                     layout, self.node_replays, self.cfg.replay_ratio)
        if layout != now:
            self._derive_rngs(step)
        self.resumed_from = found
        wait_all(world)
        if world.Get_rank() == 0:
            line = (f"pal_hpc: resumed from {found} (update {self.learner.updates}, "
                    f"{int(self.stats.mine[S.ENV_STEPS])} env steps on rank 0)")
            if layout != now:
                line = (f"pal_hpc: resumed {RL.describe_layout(layout)} -> "
                        f"{RL.describe_layout(now)}" + (f"; {note}" if note else "")
                        + f"; RNG streams derived from (seed {self.cfg.seed}, update {step}, "
                        f"rank); from {found} (update {step}, "
                        f"{self.restored['env_steps']:,} env steps)")
            elif note:
                line += f"; {note}"
            print(line, flush=True)
            if used := wall_budget_used(self.cfg, self.restored.get("wall_s", 0.0)):
                print(used, flush=True)

    def _layout_now(self) -> list:
        return [[r.node, r.is_actor, r.is_learner] for r in self.topo.roles]

    def _restore_rank(self, g) -> None:
        """The same layout: this rank's own counters, RNG states and schedule."""
        saved = json.loads(g.attrs["stats"])[:S.SIZE]   # older files: fewer slots
        capacity = self.stats.mine[S.REPLAY_CAPACITY]   # this run's (it may differ)
        self.stats.mine[:len(saved)] = saved
        self.stats.mine[S.REPLAY_CAPACITY] = capacity
        # Requests of the old run (stop, preemption, checkpoints) are not this run's.
        for slot in (S.PREEMPT, S.STOP, S.CHECKPOINTS):
            self.stats.mine[slot] = 0.0
        saved_torch = np.array(g["torch_rng"][()])
        if self.uses_torch and saved_torch.size:
            torch = torch_module()
            torch.set_rng_state(torch.from_numpy(saved_torch))
        if self.actor is not None:
            self.actor.steps = int(g.attrs["actor_steps"])
            self.actor.rng.bit_generator.state = json.loads(g.attrs["np_rng"])
        if self.learner is not None and g.attrs.get("learner_rng", ""):
            self.learner.rng.bit_generator.state = json.loads(g.attrs["learner_rng"])
        if "next_eval" in g.attrs:        # else the evaluator evaluates at once
            self.next_eval = float(g.attrs["next_eval"])

    def _carry_ranks(self, f: h5py.File, layout: list, now: list) -> None:
        """Another layout: this rank's share of the old ranks' counters (their sums kept
        exactly) and the old evaluator's schedule."""
        saved = []
        for rank in range(len(layout)):
            values = json.loads(f[f"ranks/rank_{rank}"].attrs["stats"])[:S.SIZE]
            saved.append(np.pad(np.asarray(values, np.float64), (0, S.SIZE - len(values))))
        rank = self.world.Get_rank()
        self.stats.mine[:], steps = RL.carried_counters(saved, layout, now, rank,
                                                        self.stats.mine)
        if self.actor is not None:
            self.actor.steps = steps
        g = f[f"ranks/rank_{RL.evaluator_rank(layout)}"]
        if "next_eval" in g.attrs:
            self.next_eval = float(g.attrs["next_eval"])

    def _derive_rngs(self, step: int) -> None:
        """Another layout: this rank's RNG streams from (seed, update, rank)."""
        seed, rank = self.cfg.seed, self.world.Get_rank()
        if self.uses_torch:
            torch_module().manual_seed(RL.derived_torch_seed(seed, step, rank))
        if self.learner is not None:
            self.learner.rng = RL.derived_rng(seed, step, rank, RL.LEARNER_RNG)
        if self.actor is not None:
            self.actor.rng = RL.derived_rng(seed, step, rank, RL.ACTOR_RNG)
            seeds = RL.derived_env_seeds(seed, step, rank, len(self.actor.envs))
            for i, (env, s) in enumerate(zip(self.actor.envs, seeds)):
                self.actor.obs[i] = env.reset(seed=s)[0]

    def _find_checkpoint(self, check=None):
        """Rank 0: the checkpoint --resume names (verified), or None for a first start
        under --resume auto.  Raises ConfigError when there is none to resume, or when
        `check(path)` refuses it (before anything is moved); returns (path, what
        `check` returned) when `check` is given."""
        cfg = self.cfg
        run_dir = cfg.resolved_run_dir()
        skipped: list = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if cfg.resume == "auto" and not ckpt.list_checkpoints(run_dir):
                    found = None                 # a first start: nothing to resume
                elif cfg.resume in ("latest", "auto"):
                    found = str(ckpt.latest_valid(run_dir, skipped))
                else:
                    ckpt.verify_all(Path(cfg.resume))
                    found = cfg.resume
            for w in caught:
                print(f"pal_hpc: warning: {w.message}", flush=True)
        except ckpt.CheckpointError as exc:
            raise ConfigError(f"resume: {exc}") from None
        checked = check(found) if check is not None and found is not None else None
        # What failed to verify is set aside now, so no later prune or resume counts it.
        for path, reason in skipped:
            moved = ckpt.set_aside(path, reason)
            print(f"pal_hpc: set aside damaged checkpoint {path.name} -> {moved}", flush=True)
        if found is None:
            return None
        self.pruner.mark_good(Path(found))
        self.last_good = found
        # Going back to an older checkpoint abandons the newer ones: set them aside, so
        # that neither pruning nor a later --resume latest mistakes them for this run's.
        mine = Path(found).resolve()
        step = ckpt.step_of(mine)
        if mine.parent == ckpt.checkpoint_dir(run_dir).resolve() and step is not None:
            newer = [p for p in ckpt.list_checkpoints(run_dir) if ckpt.step_of(p) > step]
            for p in newer:
                moved = ckpt.set_aside(p, f"newer than {mine.name}, which --resume went back "
                                          f"to", folder=ckpt.SUPERSEDED)
                print(f"pal_hpc: set aside {p.name} -> {moved} (newer than the checkpoint "
                      f"resumed from)", flush=True)
        return found if check is None else (found, checked)

    def _check_fits(self, path: str) -> bool:
        """Rank 0: refuse, naming the field, a checkpoint this run cannot continue: another
        algorithm, env, network shape, priority exponent, or observation layout in the
        replay.  A rank layout, node count or replay capacity of its own is no reason.
        Returns whether each node can load its own saved buffer as it is (the same
        layout and buffers), else the replay is re-split."""
        with h5py.File(path, "r") as f:
            attrs = {k: f.attrs[k] for k in f.attrs}
        saved = json.loads(attrs["config"])
        mine = config_to_dict(self.cfg)
        saved_sig = json.loads(attrs.get("algo_signature", "{}"))
        checks = [(name, saved.get(name), mine.get(name))
                  for name in ("algo", "env", "per_alpha", "per_eps")]
        checks += [(name, value, self.algo_signature.get(name))
                   for name, value in saved_sig.items()]
        for name, then, now in checks:
            if then != now:
                raise ConfigError(f"{name}: the checkpoint was trained with {then!r}, this run "
                                  f"asks for {now!r}; resuming would change shapes")
        replay_files = json.loads(attrs["replay_files"])
        if not replay_files:
            return True
        here = {node: json.loads(json.dumps(sig)) for node, sig, _ in self.node_replays}
        sigs = {}
        for name in replay_files:
            node = ckpt.node_of_replay(name)
            try:
                with h5py.File(Path(path).with_name(name), "r") as rf:
                    sigs[node] = json.loads(rf.attrs["signature"])
            except (OSError, KeyError, ValueError) as exc:
                raise ConfigError(f"resume: {name}: not a replay file of this format "
                                  f"({exc})") from None
            RR.check_replay_kind(sigs[node], here[0])
        return (json.loads(attrs["layout"]) == self._layout_now()
                and all(sigs.get(node) == sig for node, sig in here.items()))
