"""The checkpoint side of a replay: its signature, its whole memory as bytes, and the
compact state (only the rows ever written) saved and restored with every check made
before anything changes.  A mixin of SharedReplay (the attributes it reads are set there)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from pal_hpc.replay.spec import _read_only, _state_array


class ReplayState:
    """signature(), state_bytes()/load_state_bytes(), state_arrays()/load_state_arrays()."""

    def signature(self) -> dict:
        """What a saved buffer must match to be loaded into this one."""
        return {"capacity": self.capacity, "regions": self.regions, "fanout": self.fanout,
                "alpha": self.alpha, "eps": self.eps, "nbytes": self.nbytes,
                "spec": {n: [list(s), d.str] for n, (s, d) in self.spec.items()}}

    def state_bytes(self) -> np.ndarray:
        """The whole buffer -- counters, tree, slot counters, columns -- as one uint8 view
        (state_arrays() is the compact form, without the rows never written).

        Take it only while no rank writes or samples (a checkpoint's safe point)."""
        self._live()
        return self._mem

    def load_state_bytes(self, raw) -> None:
        """Restore a buffer saved with `state_bytes()` into this one (same signature).

        Call on one rank of the node while no rank uses the buffer; locks and region
        claims held at save time are released."""
        core = self._live()
        raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
        if raw.size != self.nbytes:
            raise ValueError(f"saved replay has {raw.size} bytes, this buffer has {self.nbytes}")
        self._mem[:] = raw
        core.reset_locks()

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The buffer's state for a checkpoint, holding only the rows ever written.

        Keys: "control" (cursors, sample count, max priority), "tree" (the tree's
        memory), "seq" (per-slot counters), "region_rows" (int64 per ring -- a region, or a
        frame replay's stream: rows saved, min(writes, ring length); a ring fills from
        its first slot, so these are its first rows) and "column.<field>" (those rows, regions in
        order).  Arrays may be read-only views of the live buffer: take and write
        them while no rank writes or samples (a checkpoint's safe point)."""
        self._live()
        rows = self._rows_written()
        runs = self._written_runs(rows)
        lay = self._layout
        out = {"control": self._control.copy(),
               "tree": _read_only(self._mem[lay.tree_off:lay.tree_off + lay.tree_nbytes]),
               "seq": _read_only(self._seq),
               "region_rows": rows}
        for name, col in self._columns.items():
            parts = [col[a:b] for a, b in runs] or [col[:0]]
            out[f"column.{name}"] = (_read_only(parts[0]) if len(parts) == 1
                                     else np.concatenate(parts))
        return out

    def load_state_arrays(self, state) -> None:
        """Restore a state from `state_arrays()` of a buffer with the same signature().

        Every array is checked (dtype, shape, consistency with the saved cursors)
        before anything changes; rows never written are zeroed.  Values may be numpy
        arrays or anything sliceable with .dtype and .shape (h5py datasets: columns
        are then read region by region).  Call on one rank of the node while no rank
        uses the buffer; locks and region claims held at save time are released."""
        core = self._live()
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping of name -> array, got {type(state).__name__}")
        lay = self._layout
        columns = {f"column.{n}": n for n in self.spec}
        wanted = {"control", "tree", "seq", "region_rows", *columns}
        missing, extra = sorted(wanted - set(state)), sorted(set(state) - wanted)
        if missing or extra:
            raise ValueError(f"saved replay state does not fit this buffer: missing {missing}, "
                             f"unknown {extra}")
        control = np.asarray(_state_array(state, "control", np.uint64, (lay.control_words,)))
        tree = np.asarray(_state_array(state, "tree", np.uint8, (lay.tree_nbytes,)))
        seq = np.asarray(_state_array(state, "seq", np.uint64, (self.capacity,)))
        rows = np.asarray(_state_array(state, "region_rows", np.int64, (len(self._ring_len),)))
        expect = [min(w, n) for w, n in zip(self._ring_writes(control), self._ring_len)]
        if rows.tolist() != expect:
            raise ValueError(f"state array 'region_rows' is {rows.tolist()}, but the saved "
                             f"insert counters give {expect}")
        here = self._mem[lay.tree_off:lay.tree_off + 64]
        if not np.array_equal(tree[:64], here):
            raise ValueError("state array 'tree' does not start with this buffer's tree header")
        written = np.zeros(self.capacity, bool)
        for a, b in self._written_runs(rows):
            written[a:b] = True
        if (seq[~written] != 0).any() or (seq[written] == 0).any():
            raise ValueError("state array 'seq' disagrees with 'region_rows' about which slots "
                             "were written")
        saved = {name: _state_array(state, key, self.spec[name][1],
                                    (int(rows.sum()),) + self.spec[name][0])
                 for key, name in columns.items()}

        self._control[:] = control
        self._mem[lay.tree_off:lay.tree_off + lay.tree_nbytes] = tree
        self._seq[:] = seq
        for name, col in self._columns.items():
            k = 0
            for start, length, n in zip(self._ring_start, self._ring_len, rows.tolist()):
                stop = start + length
                if n:
                    col[start:start + n] = saved[name][k:k + n]
                col[start + n:stop] = 0
                k += n
        core.reset_locks()

    def _rows_written(self) -> np.ndarray:
        return np.array([min(w, n) for w, n in zip(self._ring_writes(self._control),
                                                   self._ring_len)], np.int64)

    def _written_runs(self, rows) -> list[tuple[int, int]]:
        """Maximal (start, stop) slot ranges holding the first `rows[r]` slots of each ring."""
        runs = []
        for start, n in zip(self._ring_start, np.asarray(rows).tolist()):
            if n == 0:
                continue
            if runs and runs[-1][1] == start:
                runs[-1] = (runs[-1][0], start + n)
            else:
                runs.append((start, start + n))
        return runs
