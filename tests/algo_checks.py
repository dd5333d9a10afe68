"""Helpers the algorithm test files share (test_ddpg.py, test_td3.py)."""

from __future__ import annotations

import numpy as np


def update(algo, u: int, batch: dict) -> None:
    """One full update on one learner (no Allreduce)."""
    for phase in algo.phases(u):
        out = np.zeros(algo.phase_size(phase), np.float32)
        algo.compute_gradients(phase, batch, out)
        algo.apply_gradients(phase, out)


def mlp_np(mlp, x: np.ndarray) -> np.ndarray:
    """A nets.MLP evaluated in float64 numpy."""
    layers = list(mlp.layers)
    for i, layer in enumerate(layers):
        x = x @ layer.weight.detach().double().numpy().T + layer.bias.detach().double().numpy()
        if i < len(layers) - 1:
            x = np.maximum(x, 0.0)
    return x
