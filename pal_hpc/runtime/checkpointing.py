"""Checkpoints of a running job, and resuming one (the file formats: `pal_hpc.io.checkpoint`).

`Checkpointing` is a part of `RankRun` (a mixin): its methods run on the rank's state
-- cfg, topo, the algorithm in `learner`, `actor`, `replay`, `stats`, `coord`,
`next_eval`, `pruner` and `last_good` -- and keep the checkpoint logic in one file.
Writing is collective over every rank, at a safe point; resuming restores every
rank's share: parameters, optimizers, counters, RNG states and each node's replay.
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
import torch

from pal_hpc.cluster.collectives import on_rank0, wait_all
from pal_hpc.config import ConfigError
from pal_hpc.config_io import config_to_dict
from pal_hpc.io import checkpoint as ckpt
from pal_hpc.runtime import stats as S


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
        f.attrs["signature"] = json.dumps(self.replay.signature())
        group = f.create_group("replay")
        for name, arr in state.items():
            group.create_dataset(name, data=arr, chunks=True if arr.size else None)

    def _rank_state(self) -> dict:
        actor = self.actor
        return {
            "rank": self.world.Get_rank(),
            "actor_steps": actor.steps if actor is not None else 0,
            "stats": self.stats.mine.tolist(),
            "np_rng": json.dumps(actor.rng.bit_generator.state) if actor is not None else "",
            "learner_rng": (json.dumps(self.learner.rng.bit_generator.state)
                            if self.learner is not None else ""),
            "torch_rng": torch.get_rng_state().numpy(),
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
        """Restore parameters, optimizer, counters, RNG states and replay buffers."""
        world, me = self.world, self.me
        found = on_rank0(world, self._find_checkpoint)
        found = world.bcast(found, root=0)
        if found is None:
            return
        with h5py.File(found, "r") as f:
            self._check_fits(f.attrs)
            if self.learner is not None:
                self.learner.algo.load_state_dict(ckpt.load_tree(f["algo"]))
                self.learner.updates = int(f.attrs["updates"])
                if self.learner.weights is not None:
                    self.learner.weights.publish(self.learner.algo.policy_params())
            g = f[f"ranks/rank_{world.Get_rank()}"]
            saved = json.loads(g.attrs["stats"])[:S.SIZE]   # older files: fewer slots
            self.stats.mine[:len(saved)] = saved
            # Requests of the old run (stop, preemption, checkpoints) are not this run's.
            for slot in (S.PREEMPT, S.STOP, S.CHECKPOINTS):
                self.stats.mine[slot] = 0.0
            torch.set_rng_state(torch.from_numpy(np.array(g["torch_rng"][()])))
            if self.actor is not None:
                self.actor.steps = int(g.attrs["actor_steps"])
                self.actor.rng.bit_generator.state = json.loads(g.attrs["np_rng"])
            if self.learner is not None and g.attrs.get("learner_rng", ""):
                self.learner.rng.bit_generator.state = json.loads(g.attrs["learner_rng"])
            if "next_eval" in g.attrs:        # else the evaluator evaluates at once
                self.next_eval = float(g.attrs["next_eval"])
            self.restored = {"wall_s": float(f.attrs["wall_s"]),
                             "evals": json.loads(f.attrs["evals"])}
            replay_files = json.loads(f.attrs["replay_files"])
        replay_file = ckpt.replay_file_of(Path(found), replay_files, me.node)
        if me.local_rank == 0 and replay_file is not None:
            with h5py.File(replay_file, "r") as rf:
                if json.loads(rf.attrs["signature"]) != json.loads(json.dumps(self.replay.signature())):
                    raise ConfigError("replay_capacity: the saved replay buffer does not match "
                                      "this run's (capacity, fanout, spec or regions differ)")
                group = rf["replay"]
                self.replay.load_state_arrays({name: group[name][()] for name in group})
        self.resumed_from = found
        wait_all(world)
        if world.Get_rank() == 0:
            print(f"pal_hpc: resumed from {found} (update {self.learner.updates}, "
                  f"{int(self.stats.mine[S.ENV_STEPS])} env steps on rank 0)", flush=True)

    def _find_checkpoint(self) -> str | None:
        """Rank 0: the checkpoint --resume names (verified), or None for a first start
        under --resume auto.  Raises ConfigError when there is none to resume."""
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
        return found

    def _check_fits(self, attrs) -> None:
        """Refuse, naming the field, a checkpoint whose shapes differ from this run's."""
        saved = json.loads(attrs["config"])
        mine = config_to_dict(self.cfg)
        saved_sig = json.loads(attrs.get("algo_signature", "{}"))
        checks = [(name, saved.get(name), mine.get(name))
                  for name in ("algo", "env", "replay_capacity", "fanout", "per_alpha",
                               "per_eps")]
        checks += [(name, value, self.algo_signature.get(name))
                   for name, value in saved_sig.items()]
        for name, then, now in checks:
            if then != now:
                raise ConfigError(f"{name}: the checkpoint was trained with {then!r}, this run "
                                  f"asks for {now!r}; resuming would change shapes")
        layout = json.loads(attrs["layout"])
        now = [[r.node, r.is_actor, r.is_learner] for r in self.topo.roles]
        if layout != now:
            raise ConfigError(f"ranks_per_node: the checkpoint was written by {len(layout)} ranks "
                              f"laid out as {layout}; this run has {len(now)} laid out as {now}")
