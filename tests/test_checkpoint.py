"""Checkpoint files: atomic, checksummed, loaded without pickle, corrupt ones skipped."""

import json
import warnings

import gymnasium as gym
import h5py
import numpy as np
import pytest
import torch

from pal_hpc.algos import DQN
from pal_hpc.algos.dqn import DQNConfig
from pal_hpc.io import checkpoint as ckpt


def write(run_dir, step, payload=1.0):
    def fill(f):
        f.attrs["config"] = json.dumps({"x": payload})
        f.create_dataset("data", data=np.full(1000, payload))
        f.attrs["replay_files"] = "{}"
    return ckpt.write_atomic(ckpt.main_path(run_dir, step), fill)


def test_write_verify_and_latest(tmp_path):
    write(tmp_path, 10, 1.0)
    write(tmp_path, 20, 2.0)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step_0000000010.h5",
                                                                "step_0000000020.h5"]
    assert ckpt.latest_valid(tmp_path).name == "step_0000000020.h5"
    assert not list(ckpt.checkpoint_dir(tmp_path).glob("*.tmp"))


def test_corrupt_and_truncated_checkpoints_fall_back_with_a_warning(tmp_path):
    write(tmp_path, 10, 1.0)
    newest = ckpt.main_path(tmp_path, 20)
    write(tmp_path, 20, 2.0)
    # Flip one byte of the data: the file still opens, the checksum catches it.
    with h5py.File(newest, "r") as f:
        offset = f["data"].id.get_offset()
    raw = bytearray(newest.read_bytes())
    raw[offset + 8] ^= 0xFF
    newest.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="checksum mismatch"):
        assert ckpt.latest_valid(tmp_path).name == "step_0000000010.h5"
    # A truncated file (a job killed mid-copy) does not even open.
    write(tmp_path, 30, 3.0)
    truncated = ckpt.main_path(tmp_path, 30)
    truncated.write_bytes(truncated.read_bytes()[:500])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ckpt.latest_valid(tmp_path).name == "step_0000000010.h5"
    assert len(caught) == 2


def test_no_valid_checkpoint(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="no valid checkpoint"):
        ckpt.latest_valid(tmp_path)


def test_prune_keeps_newest(tmp_path):
    for step in (1, 2, 3, 4):
        write(tmp_path, step)
        ckpt.replay_path(ckpt.main_path(tmp_path, step), 0).write_bytes(b"x")
    ckpt.replay_path(ckpt.main_path(tmp_path, 9), 0, "dead").write_bytes(b"x")  # orphan
    notes = ckpt.Pruner(tmp_path, 2).prune()
    names = sorted(p.name for p in ckpt.checkpoint_dir(tmp_path).iterdir())
    # Replay files the kept checkpoints do not list (these list none) are orphans.
    assert names == ["step_0000000003.h5", "step_0000000004.h5"]
    assert len(notes) == 2 and all("deleted old checkpoint" in n for n in notes)


def flip_byte(path):
    with h5py.File(path, "r") as f:
        offset = f["data"].id.get_offset()
    raw = bytearray(path.read_bytes())
    raw[offset + 8] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_prune_never_keeps_a_damaged_checkpoint_over_a_good_one(tmp_path):
    """Pruning by step number alone deleted the good checkpoints and kept a corrupt
    newest one (or a junk step_999999.h5); now damaged files are set aside."""
    for step in (1, 2, 3):
        write(tmp_path, step)
    flip_byte(ckpt.main_path(tmp_path, 3))
    junk = ckpt.checkpoint_dir(tmp_path) / "step_999999.h5"
    junk.write_bytes(b"not a checkpoint at all")
    notes = ckpt.Pruner(tmp_path, 1).prune()
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step_0000000002.h5"]
    assert ckpt.latest_valid(tmp_path).name == "step_0000000002.h5"
    damaged = ckpt.checkpoint_dir(tmp_path) / ckpt.DAMAGED
    moved = sorted(p.name for p in damaged.glob("*.h5"))
    assert len(moved) == 2 and moved[0].startswith("step_0000000003.")
    reasons = (damaged / "REASONS.txt").read_text()
    assert "checksum mismatch" in reasons and "step_999999.h5: " in reasons
    assert sum("set aside damaged" in n for n in notes) == 2


def test_a_write_that_fails_leaves_no_temporary_and_keeps_the_old_file(tmp_path):
    write(tmp_path, 5, 1.0)
    path = ckpt.main_path(tmp_path, 5)
    before = path.read_bytes()

    def fill(f):
        f.create_dataset("data", data=np.zeros(10))
        raise OSError(28, "No space left on device")
    with pytest.raises(OSError, match="No space left"):
        ckpt.write_atomic(path, fill)
    assert path.read_bytes() == before
    assert not list(ckpt.checkpoint_dir(tmp_path).glob("*.tmp"))


def test_a_replay_file_or_foreign_file_is_not_a_checkpoint(tmp_path):
    main = ckpt.main_path(tmp_path, 7)
    replay = ckpt.replay_path(main, 0, "ab12cd34")
    ckpt.write_atomic(replay, lambda f: f.create_dataset("raw", data=np.zeros(4)))
    with pytest.raises(ckpt.CheckpointError, match=r"node 0's replay buffer.*pass .*step_0000000007\.h5"):
        ckpt.verify_all(replay)
    other = tmp_path / "other.h5"
    ckpt.write_atomic(other, lambda f: f.create_dataset("x", data=np.zeros(4)))
    with pytest.raises(ckpt.CheckpointError, match="not a pal_hpc checkpoint"):
        ckpt.verify_all(other)


def test_dqn_state_round_trip_is_exact(tmp_path):
    def make(seed):
        # Target syncs every 4 updates: the 4th, taken after the restore, syncs only if
        # the update count came back too.
        return DQN(gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2),
                   DQNConfig(hidden=[16, 16], target_update=4), seed=seed)

    def update(a):
        grad = np.zeros(a.phase_size("q"), np.float32)
        a.compute_gradients("q", batch, grad)
        a.apply_gradients("q", grad)

    algo = make(3)
    rng = np.random.default_rng(0)
    batch = {"obs": rng.random((32, 4), dtype=np.float32), "action": rng.integers(0, 2, 32),
             "reward": rng.random(32, dtype=np.float32), "next_obs": rng.random((32, 4), dtype=np.float32),
             "discount": np.full(32, 0.99, np.float32), "weights": np.ones(32, np.float32)}
    for _ in range(3):
        update(algo)
    path = tmp_path / "algo.h5"
    ckpt.write_atomic(path, lambda f: ckpt.save_tree(f.create_group("algo"), algo.state_dict()))
    ckpt.verify(path)
    other = make(99)
    with h5py.File(path, "r") as f:
        other.load_state_dict(ckpt.load_tree(f["algo"]))
    np.testing.assert_array_equal(other.get_flat_params(), algo.get_flat_params())
    assert other.digest() == algo.digest() and other.updates == algo.updates == 3
    assert torch.equal(next(other.target.parameters()), next(algo.target.parameters()))
    assert not torch.equal(next(other.target.parameters()), next(other.online.parameters()))
    # The optimizer state came back too: one more identical step stays identical.
    for a in (algo, other):
        update(a)
    np.testing.assert_array_equal(other.get_flat_params(), algo.get_flat_params())
    assert torch.equal(next(other.target.parameters()), next(algo.target.parameters()))
    for a in (algo, other):   # update 4 synced the target
        assert all(torch.equal(p, q) for p, q in zip(a.online.parameters(), a.target.parameters()))
