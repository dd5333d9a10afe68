"""PAAC's network and acting: the actor-critic (a CNN or MLP torso with a policy head
and a value head), sampling actions from its logits with a numpy generator, and the
CPU policy evaluations use."""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from pal_hpc.algos.base import NetworkPolicy
from pal_hpc.algos.nets import is_image, output_linear, torso


class ActorCritic(nn.Module):
    """A torso (NIPS/Nature CNN on uint8 frames, an MLP on vectors) with a policy head
    (logits over the actions) and a value head; with `shared=False` the value head has
    a torso of its own."""

    def __init__(self, obs_space: gym.Space, n_actions: int, cnn: str = "nips",
                 hidden: Sequence[int] = (64, 64), activation: str = "relu",
                 shared: bool = True, init: str = "default"):
        super().__init__()
        self.trunk = torso(obs_space, cnn, hidden, activation)
        self.value_trunk = None if shared else torso(obs_space, cnn, hidden, activation)
        self.image = is_image(obs_space)
        self.policy = nn.Linear(self.trunk.out_features, n_actions)
        self.value = nn.Linear(self.trunk.out_features, 1)
        with torch.no_grad():
            if init == "orthogonal":
                for m in self.modules():
                    if isinstance(m, (nn.Linear, nn.Conv2d)):
                        nn.init.orthogonal_(m.weight, math.sqrt(2.0))
                        m.bias.zero_()
                nn.init.orthogonal_(self.policy.weight, 0.01)
                nn.init.orthogonal_(self.value.weight, 1.0)
            else:                         # a near-uniform first policy
                self.policy.weight.mul_(0.01)
                self.policy.bias.zero_()

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits (B, n_actions), values (B,)) of a batch of observations."""
        z = self.trunk(obs)
        zv = z if self.value_trunk is None else self.value_trunk(obs)
        # The heads in fp32 under bf16 autocast too (nets.output_linear).
        return (output_linear(z, self.policy.weight, self.policy.bias),
                output_linear(zv, self.value.weight, self.value.bias).squeeze(-1))

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        """The policy's logits alone (acting needs no value; with separate torsos this
        skips the value torso)."""
        return output_linear(self.trunk(obs), self.policy.weight, self.policy.bias)


def sample_actions(logits: torch.Tensor, rng: np.random.Generator) -> np.ndarray:
    """One action per row of `logits`, drawn from softmax(logits) with `rng` (numpy:
    its state goes into checkpoints, so a resumed run draws what the original would)."""
    probs = torch.softmax(logits.detach().double(), dim=-1).cpu().numpy()
    cdf = np.cumsum(probs, axis=1)
    u = rng.random(len(cdf))[:, None] * cdf[:, -1:]
    return np.minimum((cdf <= u).sum(axis=1), probs.shape[1] - 1).astype(np.int64)


class PAACPolicy(NetworkPolicy):
    """A CPU copy of the actor-critic: samples from the policy, or (deterministic,
    for evaluation) takes its most likely action."""

    def __init__(self, net: ActorCritic):
        self.obs_dtype = None if net.image else torch.float32
        super().__init__(net)

    @torch.no_grad()
    def act(self, obs, rng, global_steps, deterministic=False):
        logits, _ = self.net(torch.as_tensor(obs, dtype=self.obs_dtype))
        if deterministic:
            return logits.argmax(dim=1).numpy().astype(np.int64)
        return sample_actions(logits, rng)
