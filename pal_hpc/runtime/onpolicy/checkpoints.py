"""Checkpoints and resume of an on-policy job: parameters, optimizer, counters and the
masters' sampling RNGs, written by rank 0 for all masters."""

from __future__ import annotations

import json
import sys
import time

import h5py
import numpy as np
from mpi4py import MPI

from pal_hpc.config import ConfigError
from pal_hpc.config_io import config_to_dict
from pal_hpc.io import checkpoint as ckpt
from pal_hpc.runtime import resume_layout as RL
from pal_hpc.runtime import stats as S
from pal_hpc.runtime.checkpointing import Checkpointing, torch_module
from pal_hpc.runtime.coordinator import wall_budget_used


class MasterCheckpointing(Checkpointing):
    """A part of `OnPolicyRun` (a mixin): the masters' checkpoints (no replay) and
    resume, on the off-policy side's Checkpointing (finding, pruning, announcing)."""

    def _checkpoint(self, totals: np.ndarray) -> str | None:
        """Collective over the masters: rank 0 writes the main file (no replay).
        Returns its path on every master, or None when it could not be written."""
        comm = self.ckpt_comm
        algo = self.algo
        state = {"rank": self.world.Get_rank(), "node_steps": self.node_steps,
                 "stats": self.stats.mine.tolist(),
                 "np_rng": json.dumps(self.rng.bit_generator.state),
                 "torch_rng": torch_module().get_rng_state().numpy(),
                 "next_eval": float(self.next_eval)}
        gathered = comm.gather(state, root=0)
        written = None
        if comm.Get_rank() == 0:
            main = ckpt.main_path(self.cfg.resolved_run_dir(), algo.updates)
            try:
                ckpt.write_atomic(main, lambda f: self._fill(f, totals, gathered),
                                  in_memory=True)
                written = str(main)
                self._after_checkpoint(main)
            except OSError as exc:
                print(f"pal_hpc: error: checkpoint at update {algo.updates} not written: "
                      f"{exc}; the newest checkpoint is still {self.last_good or 'none'}",
                      file=sys.stderr, flush=True)
        return comm.bcast(written, root=0)

    def _fill(self, f: h5py.File, totals: np.ndarray, states: list) -> None:
        cfg, algo = self.cfg, self.algo
        a = f.attrs
        a["format"] = ckpt.FORMAT_VERSION
        a["updates"] = algo.updates
        a["env_steps"] = int(totals[S.ENV_STEPS])
        a["global_steps"] = self._global_steps()
        a["wall_s"] = time.monotonic() - self.start
        a["config"] = json.dumps(config_to_dict(cfg))
        a["layout"] = json.dumps(self.topo.node_sizes)
        a["num_envs"] = json.dumps(self.node_envs)
        a["evals"] = json.dumps(self.coord.evals if self.coord is not None else [])
        a["replay_files"] = json.dumps({})
        a["params_digest"] = algo.digest()
        a["algo_signature"] = json.dumps(algo.signature())
        ckpt.save_tree(f.create_group("algo"), algo.state_dict())
        ranks = f.create_group("ranks")
        for st in states:
            g = ranks.create_group(f"rank_{st['rank']}")
            g.create_dataset("torch_rng", data=st["torch_rng"])
            g.attrs["node_steps"] = st["node_steps"]
            g.attrs["stats"] = json.dumps(st["stats"])
            g.attrs["np_rng"] = st["np_rng"]
            g.attrs["next_eval"] = st["next_eval"]

    def _check_fits_file(self, path: str) -> None:
        """Rank 0: refuse, naming the field, a checkpoint this job cannot continue."""
        with h5py.File(path, "r") as f:
            attrs = {k: f.attrs[k] for k in f.attrs}
        saved = json.loads(attrs["config"])
        sig = json.loads(attrs.get("algo_signature", "{}"))
        if saved.get("algo") != self.cfg.algo:
            raise ConfigError(f"algo: the checkpoint was trained with {saved.get('algo')!r}, "
                              f"this run asks for {self.cfg.algo!r}")
        if saved.get("env") != self.cfg.env:
            raise ConfigError(f"env: the checkpoint was trained with {saved.get('env')!r}, "
                              f"this run asks for {self.cfg.env!r}")
        mine = json.loads(json.dumps(self.algo.signature()))
        for name, then in sig.items():
            if mine.get(name) != then:
                raise ConfigError(f"{name}: the checkpoint was trained with {then!r}, this "
                                  f"run asks for {mine.get(name)!r}; resuming would change "
                                  f"shapes")

    def _restore(self, path: str) -> None:
        """A master: parameters, optimizer, counters and RNG states from `path`.

        On the layout the checkpoint was written on (the same node sizes and
        environments per node) every master continues its own counters and RNG
        streams, bit for bit.  On another one (another node count, ranks per node or
        --num-envs) no old master is a new one, so the job-wide counters are kept
        and re-dealt (`carried_master_counters`), the evaluation schedule is rank 0's,
        and this master's sampling and torch streams are derived from (seed,
        checkpoint update, world rank) as the off-policy runs derive theirs
        (`pal_hpc.runtime.resume_layout`)."""
        rank = self.world.Get_rank()
        with h5py.File(path, "r") as f:
            self.algo.load_state_dict(ckpt.load_tree(f["algo"]))
            layout = json.loads(f.attrs["layout"])
            saved_envs = json.loads(f.attrs["num_envs"])
            same = layout == self.topo.node_sizes and saved_envs == self.node_envs
            ranks = f["ranks"]
            g = ranks[f"rank_{rank}" if same else "rank_0"]
            self.next_eval = float(g.attrs["next_eval"])
            if same:
                saved = json.loads(g.attrs["stats"])[:S.SIZE]
                self.stats.mine[:len(saved)] = saved
                torch = torch_module()
                torch.set_rng_state(torch.from_numpy(np.array(g["torch_rng"][()])))
                self.rng.bit_generator.state = json.loads(g.attrs["np_rng"])
                self.node_steps = int(g.attrs["node_steps"])
            else:
                rows = [_counters(json.loads(ranks[name].attrs["stats"])) for name in ranks]
                master = self.masters.Get_rank()
                self.stats.mine[:] = carried_master_counters(rows, self.masters.Get_size(),
                                                             master)
                self.node_steps = int(self.stats.mine[S.ENV_STEPS])
                update = self.algo.updates
                self.rng = RL.derived_rng(self.cfg.seed, update, rank, RL.ACTOR_RNG)
                torch_module().manual_seed(RL.derived_torch_seed(self.cfg.seed, update, rank))
            for slot in (S.PREEMPT, S.STOP, S.CHECKPOINTS):
                self.stats.mine[slot] = 0.0
            self.restored = {"wall_s": float(f.attrs["wall_s"]),
                             "evals": json.loads(f.attrs["evals"]),
                             "global_base": int(f.attrs["global_steps"]),
                             "layout": layout, "num_envs": saved_envs, "same": same}
        # Until the first stats round, the totals are the checkpoint's.
        self.masters.Allreduce(self.stats.mine, self.stats.total, op=MPI.SUM)
        if rank == 0:
            change = ("" if same else
                      f"; {describe_masters(layout, saved_envs)} -> "
                      f"{describe_masters(self.topo.node_sizes, self.node_envs)}, "
                      f"counters re-dealt, RNG streams derived from (seed, update, rank)")
            print(f"pal_hpc: resumed from {path} (update {self.algo.updates}, "
                  f"{self.restored['global_base']:,} env steps{change})", flush=True)
            if used := wall_budget_used(self.cfg, self.restored.get("wall_s", 0.0)):
                print(used, flush=True)


def _counters(saved: list) -> np.ndarray:
    """A saved counter vector at this version's length (older files have fewer slots)."""
    out = np.zeros(S.SIZE)
    out[:min(len(saved), S.SIZE)] = saved[:S.SIZE]
    return out


def carried_master_counters(saved: list, masters: int, master: int) -> np.ndarray:
    """Master `master`'s (of `masters`) counters on another layout, from every old
    master's saved ones: the env steps dealt out over the new masters (their sum is
    the checkpoint's), every other carried counter (episodes, the updates, the
    per-round sums not yet sent) with master 0, the job's rank 0; the old run's
    requests (stop, preemption, checkpoints) and the replay's slots are not carried."""
    total = np.sum(saved, axis=0) if len(saved) else np.zeros(S.SIZE)
    out = np.zeros(S.SIZE)
    for slot in range(S.SIZE):
        if slot in RL.NOT_CARRIED:
            continue
        if slot == S.ENV_STEPS:
            out[slot] = RL.dealt(int(round(total[slot])), masters, master)
        elif master == 0:
            out[slot] = total[slot]
    return out


def describe_masters(node_sizes: list, node_envs: list) -> str:
    """"2 nodes x 3 ranks (2 masters, 16 + 16 envs)", "1 node x 2 ranks (1 master, 32 envs)"."""
    nodes = len(node_sizes)
    shape = (f"{nodes} node{'s' if nodes != 1 else ''} x {node_sizes[0]} "
             f"rank{'s' if node_sizes[0] != 1 else ''}" if len(set(node_sizes)) == 1
             else f"{nodes} nodes of {'+'.join(map(str, node_sizes))} ranks")
    return (f"{shape} ({nodes} master{'s' if nodes != 1 else ''}, "
            f"{' + '.join(map(str, node_envs))} envs)")
