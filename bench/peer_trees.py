#!/usr/bin/env python3
"""Time the prioritized-replay sum trees of peer libraries, on one thread.

Run with the peers' venv (made by bench/install_peers.sh)::

    .venv-peers/bin/python bench/peer_trees.py \
        --configs '[{"capacity": 1048576, "batch": 256}]' [--repeats N] \
        [--peers cpprb,torchrl,tianshou] [--rounds 5] [--min-time 0.2]

stdout carries exactly one JSON list, one object per (peer, op, config)::

    {"peer": "cpprb", "op": "update" | "sample", "capacity": C, "batch": B,
     "us_per_batch": float, "what": "short description"}

Everything else (versions, skipped peers, errors) goes to stderr; a peer that
does not import, or fails while being measured, is reported there and left out.

Common set-up, for every peer and config
----------------------------------------
* One thread: OMP/MKL/OpenBLAS/numba thread counts are set to 1 before numpy
  is imported, and torch.set_num_threads(1) / set_num_interop_threads(1).
* The tree has ``capacity`` leaves, all filled (untimed) with priorities drawn
  uniformly from [0.001, 1).
* ``update``: one batch = set the priorities of ``batch`` leaf indices, drawn
  uniformly with replacement, to new priorities drawn uniformly from
  [0.001, 1). The index/priority arrays are generated beforehand (untimed), in
  the dtype the peer's API takes natively (int64 indices; float32 priorities
  for cpprb and torchrl, float64 for tianshou), as a pool of up to
  ``--index-pool`` (default 2**21) index/priority pairs that the timed loop
  cycles through batch by batch, so consecutive batches touch different leaves
  and the tree is not artificially cache-warm. A small pool (e.g. 16384)
  re-touches the same leaves and gives cache-warm numbers: at capacity 2**20,
  batch 256, cpprb's update drops from ~45 us to ~10 us that way, while
  torchrl's (~7 us) and tianshou's (~37 us) barely move.
* ``sample``: one batch = draw ``batch`` indices with probability proportional
  to priority AND read back their priorities ("sample+get"). Where the peer's
  API takes prefix masses, the timed region includes what a user has to do
  for that: read the total, draw stratified masses with numpy
  (``masses = (arange(B) + rng.random(B)) * total / B``), descend the tree,
  gather the leaf priorities.
* Timing: each measurement first warms up and calibrates the number of
  batches per round so that one round lasts about ``--min-time`` seconds (or
  uses ``--repeats`` batches per round), then runs ``--rounds`` rounds with
  the garbage collector off; ``us_per_batch`` is the MEDIAN over rounds of
  (round wall time / batches in the round), in microseconds. The Python loop
  around each batch (~0.05 us) is included.

What is timed for each peer
---------------------------
cpprb (``cpprb.PrioritizedReplayBuffer``, C++ behind Cython)
    cpprb exposes no tree object: its sum and min segment trees live in a C++
    sampler inside the buffer, so the whole buffer is timed. The buffer is
    built with ``alpha=1.0, eps=0.0`` (so stored values equal the priorities,
    though cpprb still evaluates ``(p + eps) ** alpha``) and one minimal data
    field ``{"x": {}}`` (one float32 per item), filled with ``capacity`` items.
    update = ``rb.update_priorities(idx, prio)``: updates the sum tree AND the
      min tree (and cpprb's running max priority).
    sample = ``rb.sample(batch)`` (default beta=0.4): stratified proportional
      sampling in C++ via the sum tree, importance weights computed from the
      sampled priorities and the min tree (cpprb returns weights, not raw
      priorities; the weights are how a user reads them back), plus the data
      gather of the 1-float field and building the result dict.

torchrl (``torchrl._torchrl.SumSegmentTreeFp32``, C++ via pybind11)
    The tree class that torchrl's PrioritizedSampler uses, called directly
    through its numpy overloads (torchrl's sampler also keeps a
    MinSegmentTreeFp32 and applies ``(p + eps) ** alpha``; neither is timed).
    update = ``tree.update(idx_int64, prio_float32)``.
    sample = ``total = tree.query(0, C)``; stratified float64 masses with
      numpy, cast to float32; ``idx = tree.scan_lower_bound(masses)``;
      ``np.minimum(idx, C - 1, out=idx)`` (the clamp torchrl's sampler applies
      against float32 round-off); ``prio = tree.at(idx)``.

tianshou (``tianshou.data.utils.segtree.SegmentTree``, numpy + numba, float64)
    The tree class tianshou's PrioritizedReplayBuffer uses, called directly.
    update = ``tree[idx] = prio`` (its argument checks + numba ``_setitem``).
    sample = ``total = tree.reduce()``; stratified masses with numpy;
      ``idx = tree.get_prefix_sum_idx(masses)`` (its checks + numba descent);
      ``prio = tree[idx]``.

Stratified masses are scaled by ``total * (1 - 2**-40) / B`` instead of
``total / B``, so float round-off can never produce a mass equal to the total
(which tianshou rejects); that changes nothing measurable.
"""

from __future__ import annotations

import os

# Single-threaded everything; must happen before numpy/torch/numba load.
for _var in (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMBA_NUM_THREADS",
):
    os.environ[_var] = "1"
os.environ.setdefault("RL_WARNINGS", "0")  # torchrl's extension warnings

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import numpy as np  # noqa: E402

PRIO_LOW = 1e-3
DEFAULT_POOL_ITEMS = 1 << 21  # index/priority pairs pre-generated for `update`
SHRINK = 1.0 - 2.0**-40  # keeps stratified masses strictly below the total


def log(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001
        return "?"


def _limit_torch_threads() -> None:
    try:
        import torch
    except Exception:  # noqa: BLE001
        return
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or parallel work already started
        pass


# --------------------------------------------------------------------------
# Per-peer adapters. Each has `load()` (imports; raises if unavailable),
# `build(capacity, prios)` (untimed fill), and returns `run(n)` callables that
# perform n batches back to back.
# --------------------------------------------------------------------------


class Pool:
    """Pre-generated update batches, cycled through by the timed loop."""

    items = DEFAULT_POOL_ITEMS  # set from --index-pool

    def __init__(self, rng, capacity: int, batch: int, dtype) -> None:
        n = max(1, Pool.items // batch)
        n = 1 << (n.bit_length() - 1)  # power of two -> cheap modulo
        idx = rng.integers(0, capacity, size=(n, batch), dtype=np.int64)
        prio = rng.uniform(PRIO_LOW, 1.0, size=(n, batch)).astype(dtype)
        # Contiguous 1-D rows, so no peer pays for a copy.
        self.idx = [np.ascontiguousarray(r) for r in idx]
        self.prio = [np.ascontiguousarray(r) for r in prio]
        self.mask = n - 1


class CpprbPeer:
    name = "cpprb"

    def load(self) -> None:
        from cpprb import PrioritizedReplayBuffer

        self.cls = PrioritizedReplayBuffer
        self.version = _version("cpprb")

    def build(self, capacity: int, prios: np.ndarray) -> None:
        self.capacity = capacity
        self.rb = self.cls(capacity, {"x": {}}, alpha=1.0, eps=0.0)
        self.rb.add(x=np.zeros(capacity, np.float32), priorities=prios.astype(np.float32))
        assert self.rb.get_stored_size() == capacity

    def update(self, batch: int, rng):
        pool = Pool(rng, self.capacity, batch, np.float32)
        upd = self.rb.update_priorities
        idxs, prs, mask = pool.idx, pool.prio, pool.mask

        def run(n: int) -> None:
            for k in range(n):
                upd(idxs[k & mask], prs[k & mask])

        what = (
            f"cpprb {self.version} PrioritizedReplayBuffer.update_priorities "
            "(sum+min trees, alpha=1)"
        )
        return run, what

    def sample(self, batch: int, rng):
        smp = self.rb.sample

        def run(n: int) -> None:
            for _ in range(n):
                smp(batch)

        what = (
            f"cpprb {self.version} PrioritizedReplayBuffer.sample (whole buffer: "
            "stratified sampling + IS weights from sum/min trees + gather of a 1-float field)"
        )
        return run, what


class TorchrlPeer:
    name = "torchrl"

    def load(self) -> None:
        _limit_torch_threads()
        from torchrl._torchrl import SumSegmentTreeFp32

        self.cls = SumSegmentTreeFp32
        self.version = _version("torchrl")

    def build(self, capacity: int, prios: np.ndarray) -> None:
        self.capacity = capacity
        self.tree = self.cls(capacity)
        self.tree.update(np.arange(capacity, dtype=np.int64), prios.astype(np.float32))

    def update(self, batch: int, rng):
        pool = Pool(rng, self.capacity, batch, np.float32)
        upd = self.tree.update
        idxs, prs, mask = pool.idx, pool.prio, pool.mask

        def run(n: int) -> None:
            for k in range(n):
                upd(idxs[k & mask], prs[k & mask])

        return run, f"torchrl {self.version} SumSegmentTreeFp32.update (numpy int64/float32)"

    def sample(self, batch: int, rng):
        tree, cap = self.tree, self.capacity
        query, scan, at = tree.query, tree.scan_lower_bound, tree.at
        random, minimum, f32 = rng.random, np.minimum, np.float32
        base = np.arange(batch, dtype=np.float64)
        last = cap - 1

        def run(n: int) -> None:
            for _ in range(n):
                total = query(0, cap)
                masses = ((base + random(batch)) * (total * SHRINK / batch)).astype(f32)
                idx = scan(masses)
                minimum(idx, last, out=idx)
                at(idx)

        what = (
            f"torchrl {self.version} SumSegmentTreeFp32: query total + numpy stratified "
            "masses + scan_lower_bound + clamp + at"
        )
        return run, what


class TianshouPeer:
    name = "tianshou"

    def load(self) -> None:
        _limit_torch_threads()  # tianshou imports torch
        from tianshou.data.utils.segtree import SegmentTree

        self.cls = SegmentTree
        self.version = _version("tianshou")

    def build(self, capacity: int, prios: np.ndarray) -> None:
        self.capacity = capacity
        self.tree = self.cls(capacity)  # compiles its numba kernels
        self.tree[np.arange(capacity, dtype=np.int64)] = prios.astype(np.float64)

    def update(self, batch: int, rng):
        pool = Pool(rng, self.capacity, batch, np.float64)
        setitem = self.tree.__setitem__
        idxs, prs, mask = pool.idx, pool.prio, pool.mask

        def run(n: int) -> None:
            for k in range(n):
                setitem(idxs[k & mask], prs[k & mask])

        return run, f"tianshou {self.version} SegmentTree.__setitem__ (numba, float64)"

    def sample(self, batch: int, rng):
        tree = self.tree
        reduce, prefix, getitem = tree.reduce, tree.get_prefix_sum_idx, tree.__getitem__
        random = rng.random
        base = np.arange(batch, dtype=np.float64)

        def run(n: int) -> None:
            for _ in range(n):
                total = reduce()
                masses = (base + random(batch)) * (total * SHRINK / batch)
                idx = prefix(masses)
                getitem(idx)

        what = (
            f"tianshou {self.version} SegmentTree (numba, float64): reduce + numpy stratified "
            "masses + get_prefix_sum_idx + getitem"
        )
        return run, what


PEERS = {p.name: p for p in (CpprbPeer, TorchrlPeer, TianshouPeer)}


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


def _timed(run, n: int) -> float:
    t0 = time.perf_counter()
    run(n)
    return time.perf_counter() - t0


def measure(run, repeats: int | None, rounds: int, min_time: float) -> tuple[float, int]:
    """Median microseconds per batch over `rounds` rounds; also batches/round."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        run(3)  # warm-up: first calls, lazy compilation, page faults
        # Calibrate (also warms up further): grow n until a run takes >= 50 ms.
        n, dt = 1, 0.0
        while True:
            dt = _timed(run, n)
            if dt >= 0.05 or n >= (1 << 26):
                break
            n *= 2 if dt > 0.005 else 8
        if repeats:
            n = repeats
        else:
            n = max(1, math.ceil(min_time * n / max(dt, 1e-9)))
        per_batch = [_timed(run, n) / n * 1e6 for _ in range(rounds)]
    finally:
        if gc_was_enabled:
            gc.enable()
    return statistics.median(per_batch), n


# --------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", required=True,
                    help='JSON list of {"capacity": int, "batch": int}')
    ap.add_argument("--repeats", type=int, default=None,
                    help="batches per round (default: calibrated to --min-time)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds per measurement; the median is reported (default 5)")
    ap.add_argument("--min-time", type=float, default=0.2,
                    help="target seconds per round when --repeats is not given (default 0.2)")
    ap.add_argument("--peers", default=",".join(PEERS),
                    help=f"comma-separated subset of {','.join(PEERS)}")
    ap.add_argument("--index-pool", type=int, default=DEFAULT_POOL_ITEMS,
                    help="index/priority pairs pre-generated for `update` and cycled through "
                         f"(rounded down to a power-of-two number of batches; default {DEFAULT_POOL_ITEMS})")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    try:
        configs = json.loads(args.configs)
        if isinstance(configs, dict):
            configs = [configs]
        configs = [{"capacity": int(c["capacity"]), "batch": int(c["batch"])} for c in configs]
    except (ValueError, KeyError, TypeError) as exc:
        ap.error(f"--configs must be a JSON list of {{'capacity': int, 'batch': int}}: {exc}")
    for c in configs:
        if c["capacity"] < 1 or c["batch"] < 1:
            ap.error(f"capacity and batch must be positive: {c}")
    if args.repeats is not None and args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if args.index_pool < 1:
        ap.error("--index-pool must be >= 1")
    args.configs = configs
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)

    # Keep stdout pure JSON: anything printed by us or by the libraries
    # (Python or C level) goes to stderr; the JSON goes to the saved stdout.
    sys.stdout.flush()
    json_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    Pool.items = args.index_pool
    results = []
    rng = np.random.default_rng(args.seed)
    for name in args.peers:
        if name not in PEERS:
            log(f"peer_trees: skipping {name!r}: unknown peer (known: {', '.join(PEERS)})")
            continue
        peer = PEERS[name]()
        try:
            peer.load()
        except Exception as exc:  # noqa: BLE001
            log(f"peer_trees: skipping {name}: cannot import ({type(exc).__name__}: {exc})")
            continue
        log(f"peer_trees: {name} {peer.version}")
        for cfg in args.configs:
            cap, batch = cfg["capacity"], cfg["batch"]
            try:
                t0 = time.perf_counter()
                peer.build(cap, rng.uniform(PRIO_LOW, 1.0, cap))
                log(f"  capacity={cap} batch={batch}: filled in {time.perf_counter() - t0:.2f} s")
                for op in ("update", "sample"):
                    run, what = getattr(peer, op)(batch, rng)
                    us, n = measure(run, args.repeats, args.rounds, args.min_time)
                    log(f"    {op:<6} {us:10.2f} us/batch  ({args.rounds} rounds x {n} batches)")
                    results.append({
                        "peer": name, "op": op, "capacity": cap, "batch": batch,
                        "us_per_batch": round(us, 3), "what": what,
                    })
            except Exception as exc:  # noqa: BLE001
                log(f"peer_trees: {name} failed at capacity={cap} batch={batch}: "
                    f"{type(exc).__name__}: {exc}")
                traceback.print_exc(file=sys.stderr)
            finally:
                for attr in ("rb", "tree"):  # free the big tree before the next one
                    if hasattr(peer, attr):
                        delattr(peer, attr)
                gc.collect()

    with os.fdopen(json_fd, "w") as out:
        json.dump(results, out, indent=1)
        out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
