"""Convolutional torsos for uint8 frames: DQN's Nature CNN and the smaller NIPS CNN that
PAAC uses (Atari's stacked 84x84 frames), and MinAtar's one-convolution network (its
10x10 frames).

Frames stay uint8 from the emulator through the replay to the learner's device (a
quarter of float32's bytes); the torso scales them to [0, 1] as its first operation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from pal_hpc.algos.spec import CNN_NAMES, MINATAR, NATURE, NIPS, conv_out
from pal_hpc.options import ConfigError

# (out_channels, kernel, stride) of each conv layer, and the width of the dense layer
# (spec.py: torch-free).
KINDS = {"nature": NATURE, "nips": NIPS, "minatar": MINATAR}
assert tuple(KINDS) == CNN_NAMES                   # the names configs accept (spec.py)


class CNNTorso(nn.Module):
    """Conv layers then one dense layer, each followed by ReLU: (N, C, H, W) uint8
    frames -> (N, out_features) float features.

    `body` is the network proper, on float input already in [0, 1]; `forward` scales
    uint8 input by 1/255 first and refuses any other dtype (a float frame would be
    scaled twice or not at all, silently).  A shape or kind it cannot take raises
    ConfigError (a ValueError) naming the field, so a run rejects it cleanly."""

    def __init__(self, in_shape: Sequence[int], kind: str = "nature"):
        super().__init__()
        if kind not in KINDS:
            raise ConfigError(f"cnn: must be one of {', '.join(KINDS)}; got {kind!r}")
        if len(in_shape) != 3:
            raise ConfigError(f"env: a CNN torso takes (C, H, W) frames; got observations "
                              f"of shape {tuple(in_shape)}")
        convs, dense = KINDS[kind]
        channels, height, width = (int(s) for s in in_shape)
        out_h, out_w = conv_out(height, convs), conv_out(width, convs)
        if out_h < 1 or out_w < 1:
            raise ConfigError(f"env: frames of shape {tuple(in_shape)} (C, H, W) are too "
                              f"small for the {kind} CNN's convolutions (channels first: "
                              f"an (H, W, C) image must be transposed)")
        layers: list[nn.Module] = []
        for out_channels, kernel, stride in convs:
            layers += [nn.Conv2d(channels, out_channels, kernel, stride), nn.ReLU()]
            channels = out_channels
        layers += [nn.Flatten(), nn.Linear(channels * out_h * out_w, dense), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.kind = kind
        self.in_shape = (int(in_shape[0]), height, width)
        self.out_features = dense

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """Features (N, out_features) of uint8 frames (N, C, H, W)."""
        if frames.dtype != torch.uint8:
            raise TypeError(f"a CNN torso takes uint8 frames (it scales them to [0, 1]); "
                            f"got {frames.dtype}")
        return self.body(self.scaled(frames))

    @staticmethod
    def scaled(frames: torch.Tensor) -> torch.Tensor:
        """uint8 frames as the body takes them: float32 in [0, 1], channels-last."""
        # Channels-last frames let oneDNN pick its fast convolutions: on this CPU a
        # NIPS-CNN forward and backward pass over 198 frames took 41 ms instead of 73.
        frames = frames.contiguous(memory_format=torch.channels_last)
        return frames.to(torch.float32).div_(255.0)


def nature_cnn(in_shape: Sequence[int]) -> CNNTorso:
    """Mnih et al. 2015: conv 32 8x8/4, 64 4x4/2, 64 3x3/1, dense 512."""
    return CNNTorso(in_shape, "nature")


def nips_cnn(in_shape: Sequence[int]) -> CNNTorso:
    """Mnih et al. 2013 (PAAC's torso): conv 16 8x8/4, 32 4x4/2, dense 256."""
    return CNNTorso(in_shape, "nips")


def minatar_cnn(in_shape: Sequence[int]) -> CNNTorso:
    """MinAtar's network (Young & Tian 2019): conv 16 3x3/1, dense 128."""
    return CNNTorso(in_shape, "minatar")
