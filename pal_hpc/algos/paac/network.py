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
                 shared: bool = True, init: str = "torch"):
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
            elif init == "small-policy":  # a near-uniform first policy
                self.policy.weight.mul_(0.01)
                self.policy.bias.zero_()
            elif init != "torch":         # torch's own init is the released code's
                raise ValueError(f"init: {init!r} is not torch, small-policy or orthogonal")

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


def sample_actions(logits: torch.Tensor | np.ndarray, rng: np.random.Generator
                   ) -> np.ndarray:
    """One action per row of `logits`, drawn from softmax(logits) with `rng` (numpy:
    its state goes into checkpoints, so a resumed run draws what the original would)."""
    if isinstance(logits, torch.Tensor):
        logits = logits.detach().float().cpu().numpy()
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    np.exp(z, out=z)                     # softmax's numerators: the cdf is scaled below
    cdf = np.cumsum(z, axis=1)
    u = rng.random(len(cdf))[:, None] * cdf[:, -1:]
    return np.minimum((cdf <= u).sum(axis=1), z.shape[1] - 1).astype(np.int64)


class NumpyLogits:
    """The policy's logits of an MLP actor-critic computed with numpy on the CPU, from
    views of the network's own parameters (so every update is seen at once; the views
    are rebuilt if a parameter's storage moves).

    Acting on a small batch of vectors is mostly torch's fixed cost per operation:
    `bench/profile_paac_act.py` times PAAC's act on 8 CartPole observations with the
    [64, 64] tanh MLP at about 150 us through torch and 44 us through this, sampling
    included.  The logits agree with torch's to float32 rounding (the tests check
    1e-5); acting on frames, on a GPU or under bf16 stays in torch."""

    def __init__(self, net: ActorCritic):
        self.layers = [m for m in net.trunk if isinstance(m, nn.Linear)] + [net.policy]
        acts = {type(m) for m in net.trunk if not isinstance(m, nn.Linear)}
        if acts - {nn.Tanh, nn.ReLU} or len(acts) > 1:
            raise ValueError(f"NumpyLogits: an MLP of Linear layers with tanh or ReLU, "
                             f"got {net.trunk}")
        self.tanh = nn.Tanh in acts
        self._ptr = -1
        self._views: list = []

    @classmethod
    def fits(cls, net: ActorCritic, device: torch.device, bf16: bool) -> bool:
        """Whether `net` on `device` at that precision can act through numpy."""
        return (device.type == "cpu" and not bf16 and not net.image
                and isinstance(net.trunk, nn.Sequential))

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        # PAAC's parameters are views of one flat buffer for its life (FlatParams;
        # loading a checkpoint copies into them), so one pointer tells if they moved.
        ptr = self.layers[0].weight.data_ptr()
        if ptr != self._ptr:
            self._views = [(m.weight.detach().numpy().T, m.bias.detach().numpy())
                           for m in self.layers]
            self._ptr = ptr
        h = np.asarray(obs, np.float32).reshape(len(obs), -1)
        last = len(self._views) - 1
        for i, (wt, b) in enumerate(self._views):
            h = h @ wt
            h += b
            if i < last:
                if self.tanh:
                    np.tanh(h, out=h)
                else:
                    np.maximum(h, 0.0, out=h)
        return h


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
