"""What needs a GPU (marker `cuda`; each test skips without one, and fails without one
under PAL_REQUIRE_GPU=1): device picking, the learners' gradients on CUDA (DQN against
the CPU, bf16 against fp32), and a real 2-learner job with its learners on the GPU.
bench/device_check.sh runs them first."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from algo_checks import make_split_algo, make_split_batch
from conftest import pal_summary
from pal_hpc.cluster.topology import pick_device

pytestmark = pytest.mark.cuda


def test_pick_device_with_gpu(cuda_device):
    n = torch.cuda.device_count()
    for cfg_device in ("auto", "cuda"):
        assert pick_device(cfg_device, 0) == torch.device("cuda:0")
        assert pick_device(cfg_device, n) == torch.device("cuda:0")  # round robin
        assert pick_device(cfg_device, n + 1) == torch.device(f"cuda:{1 % n}")


def on(device, name, precision="fp32"):
    algo = make_split_algo(name)
    if device.type == "cpu" and precision == "fp32":
        return algo
    # The same seed, so the same initial parameters (and noise streams on one device).
    Algo, cfg = type(algo), algo.config
    cfg.precision = precision
    return Algo(algo.obs_space, algo.act_space, cfg, device=device, seed=0)


@pytest.mark.parametrize("name, precision", [("dqn", "fp32"), ("dqn", "bf16"),
                                             ("td3", "bf16"), ("sac", "bf16")])
def test_cuda_gradients_match_the_reference(cuda_device, name, precision):
    """DQN against the CPU; TD3 and SAC (whose noise comes from a generator on the
    learner's device, a different stream on CUDA) bf16 against fp32 on the GPU."""
    ref_device = torch.device("cpu") if name == "dqn" else cuda_device
    cpu, gpu = on(ref_device, name), on(cuda_device, name, precision)
    batch = make_split_batch(name, np.random.default_rng(0), 64)
    for u in range(2):
        for phase in cpu.phases(u):
            g_cpu = np.zeros(cpu.phase_size(phase), np.float32)
            g_gpu = np.zeros_like(g_cpu)
            cpu.compute_gradients(phase, batch, g_cpu)
            gpu.compute_gradients(phase, batch, g_gpu)
            cos = g_cpu @ g_gpu / (np.linalg.norm(g_cpu) * np.linalg.norm(g_gpu))
            assert cos > (0.9999 if precision == "fp32" else 0.98), (name, phase, cos)
            cpu.apply_gradients(phase, g_cpu)
            gpu.apply_gradients(phase, g_cpu)
    for a, b in zip(cpu.state_arrays(), gpu.state_arrays()):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


def test_cuda_learners_train_and_stay_identical(cuda_device, tmp_path):
    summary = pal_summary(3, tmp_path / "run", "--learners-per-node", "2", "--device", "cuda",
                          "--total-steps", "2500")
    assert summary["learners"] == 2 and summary["updates"] > 0
    assert summary["learner_params_identical"]
