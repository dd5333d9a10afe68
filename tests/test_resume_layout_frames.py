"""A frame replay (DQN on ALE/Pong-v5, each frame stored once) checkpointed at 2 virtual
nodes x 3 ranks resumes on 2 x 3 (its own layout: each node loads its buffer as it
was), on 3 x 2 (8 streams re-split into 6 longer ones) and on 1 x 2 (half the room).
Every samplable transition -- its stack, n-step successor, fields and priority, as the
buffer's own gather rebuilds them -- is the saved one, each exactly once (on 1 x 2 a
part of them); parameters and counters come back exactly; training continues."""

import json

import pytest

from resume_layout_checks import (check_counters, dump, held, run, saved_counters,
                                  train_to_checkpoint)

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

# Streams of 300 rows (1,200 slots per node, 2 actors x 2 envs), filled past their
# length by 2,400 env steps (most of them); the small NIPS CNN and few updates keep it quick.
FLAGS = ["--algo", "dqn", "--env", "ALE/Pong-v5", "--cnn", "nips", "--replay-capacity", "1200",
         "--learning-starts", "300", "--batch-size", "8", "--replay-ratio", "1",
         "--envs-per-actor", "2", "--eval-every", "0", "--eval-episodes", "1"]


def test_frame_replay_resumes_on_other_layouts(tmp_path):
    run_dir = tmp_path / "run"
    main = train_to_checkpoint(run_dir, FLAGS, 2400)
    counters = saved_counters(main)
    same = dump(tmp_path / "2x3", main, "2x3", FLAGS, timeout=400)
    saved = held(same)                           # loaded as saved: the reference
    assert sum(saved.values()) > 1000
    check_counters(same, counters)

    more = dump(tmp_path / "3x2", main, "3x2", FLAGS, timeout=400)
    check_counters(more, counters)
    assert held(more) == saved, "a transition changed, went missing or came twice"
    n = sum(saved.values())
    assert "rows kept: all of them" in more["stdout"], more["stdout"]
    assert f"{n:,} of {n:,} samplable transitions" in more["stdout"], more["stdout"]

    fewer = dump(tmp_path / "1x2", main, "1x2", FLAGS, timeout=400)
    check_counters(fewer, counters)
    kept = held(fewer)
    assert not kept - saved and 0.3 * sum(saved.values()) < sum(kept.values())
    assert (f"{sum(kept.values()):,} of {sum(saved.values()):,} samplable transitions"
            in fewer["stdout"]), fewer["stdout"]

    refused = run(2, run_dir, *FLAGS, "--no-frame-dedup", "--ranks-per-node", "2",
                  "--resume", str(main))
    assert refused.returncode == 2
    assert "invalid configuration: frame_dedup:" in refused.stderr, refused.stderr

    target = counters["env_steps"] + 400
    proc = run(2, run_dir, *FLAGS, "--ranks-per-node", "2", "--resume", str(main),
               "--total-steps", str(target), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["params_digest_at_start"] == counters["digest"]
    assert summary["env_steps"] >= target and summary["updates"] > counters["updates"]
