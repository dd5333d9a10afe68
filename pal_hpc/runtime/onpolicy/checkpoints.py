"""Checkpoints and resume of an on-policy job: parameters, optimizer, counters and the
masters' sampling RNGs, written by rank 0 for all masters."""

from __future__ import annotations

import json
import sys
import time

import h5py
import numpy as np
import torch
from mpi4py import MPI

from pal_hpc.config import ConfigError
from pal_hpc.config_io import config_to_dict
from pal_hpc.io import checkpoint as ckpt
from pal_hpc.runtime import stats as S
from pal_hpc.runtime.checkpointing import Checkpointing


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
                 "torch_rng": torch.get_rng_state().numpy(),
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
        layout = json.loads(attrs["layout"])
        if layout != self.topo.node_sizes or json.loads(attrs["num_envs"]) != self.node_envs:
            raise ConfigError(f"ranks_per_node: an on-policy run resumes on the layout it "
                              f"was checkpointed on (off-policy runs on any): the checkpoint "
                              f"was written by nodes of {layout} ranks with "
                              f"{json.loads(attrs['num_envs'])} environments; this run has "
                              f"{self.topo.node_sizes} with {self.node_envs}")

    def _restore(self, path: str) -> None:
        """A master: parameters, optimizer, counters and RNG states from `path`."""
        with h5py.File(path, "r") as f:
            self.algo.load_state_dict(ckpt.load_tree(f["algo"]))
            g = f[f"ranks/rank_{self.world.Get_rank()}"]
            saved = json.loads(g.attrs["stats"])[:S.SIZE]
            self.stats.mine[:len(saved)] = saved
            for slot in (S.PREEMPT, S.STOP, S.CHECKPOINTS):
                self.stats.mine[slot] = 0.0
            torch.set_rng_state(torch.from_numpy(np.array(g["torch_rng"][()])))
            self.rng.bit_generator.state = json.loads(g.attrs["np_rng"])
            self.node_steps = int(g.attrs["node_steps"])
            self.next_eval = float(g.attrs["next_eval"])
            self.restored = {"wall_s": float(f.attrs["wall_s"]),
                             "evals": json.loads(f.attrs["evals"]),
                             "global_base": int(f.attrs["global_steps"])}
        # Until the first stats round, the totals are the checkpoint's.
        self.masters.Allreduce(self.stats.mine, self.stats.total, op=MPI.SUM)
        if self.world.Get_rank() == 0:
            print(f"pal_hpc: resumed from {path} (update {self.algo.updates}, "
                  f"{self.restored['global_base']:,} env steps)", flush=True)
